def reliability_table(*args, **kwargs):  # placeholder
    raise NotImplementedError

def calibration_error(*args, **kwargs):  # placeholder
    raise NotImplementedError

def brier_decomposition(*args, **kwargs):  # placeholder
    raise NotImplementedError

