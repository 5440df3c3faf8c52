def log_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

def brier_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

def spherical_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

def ranked_probability_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

