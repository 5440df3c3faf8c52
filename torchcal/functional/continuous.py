def crps_normal(*args, **kwargs):  # placeholder
    raise NotImplementedError

def crps_laplace(*args, **kwargs):  # placeholder
    raise NotImplementedError

def crps_logistic(*args, **kwargs):  # placeholder
    raise NotImplementedError

def crps_ensemble(*args, **kwargs):  # placeholder
    raise NotImplementedError

def energy_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

def interval_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

def quantile_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

def gaussian_nll(*args, **kwargs):  # placeholder
    raise NotImplementedError

def dawid_sebastiani_score(*args, **kwargs):  # placeholder
    raise NotImplementedError

