class ReliabilityTable:  # placeholder
    pass
