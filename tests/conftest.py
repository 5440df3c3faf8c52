import os

import pytest
import torch
from hypothesis import settings

# CI runs the same Hypothesis examples every time (a red CI must mean a regression, not a new
# draw); locally the examples vary from run to run.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip where no CUDA device is available."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Every test starts from seed 0 on one intra-op thread: most tests use many small ops,
    for which a second thread only adds contention on the 2-core CI machine. Tests about
    threading set the count themselves."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
