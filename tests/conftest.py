import os
import shutil
import tempfile

import pytest
import torch
from hypothesis import settings

# CI runs the same Hypothesis examples every time (a red CI must mean a regression, not a new
# draw); locally the examples vary from run to run.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


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


# The slowest tests (measured with `pytest --durations=60`: each over ~4 s, most recipe runs at
# real settings), marked `slow` here in one list rather than in each file, so that
# `python -m pytest -q -m "not slow"` is the quick local loop and CI still runs everything.
# An entry is a node-id prefix relative to the repository root.
SLOW = (
    "tests/scaling/test_cv_maps.py::test_where_one_temperature_is_bayes_every_map_is_within_5e3_of_it[100]",
    "tests/scaling/test_structured.py::test_within_0002_of_probmetrics_sms",
    "tests/recipes/test_configs.py::",
    "tests/recipes/test_regression_recipe.py::test_tiny_run_end_to_end_and_deterministic",
    "tests/recipes/test_complex_e2e.py::test_tiny_family_end_to_end",
    "tests/recipes/test_calibrated_rewards.py::test_proper_reward_calibrates_improper_does_not",
    "tests/scaling/test_scaling_temperature.py::test_multiclass_reaches_brent_optimum_and_keeps_argmax",
    "tests/functional/test_calibration.py::test_22_million_samples_exact",
    "tests/audit/test_cli.py::test_module_entry_point_subprocess",
    "tests/functional/test_compile.py::",
    "tests/engines/test_differential.py::test_spark_equals_the_in_memory_path",
    "tests/hostile/test_hostile_inputs.py::test_w3_w6_w13_spark_reads_exact_names_and_group_text",
    "tests/recipes/test_bakeoff_selection.py::test_picks_are_the_epochs_of_lowest_value",
    "tests/test_bench_maps_smoke.py::test_bench_maps_quick_prints_every_case",
    "tests/functional/test_conformal_sets.py::test_marginal_coverage_is_exact_and_sharp",
)


def pytest_collection_modifyitems(config, items):
    """Mark the SLOW tests; tests marked ``cuda`` skip where no CUDA device is available; off
    CI, a machine without Java skips the tests that take the ``spark`` fixture (under CI,
    ``.ci/run`` installs Java and the fixture fails instead: a missing Java is never a skip); leave
    out the multi-process tests unless `-m` names `ddp` (so that `-m "not slow"` does not bring
    them back, as an `-m` in addopts would)."""
    skip_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    no_java = pytest.mark.skipif(not HAS_JAVA and not os.environ.get("CI"), reason=NO_JAVA)
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if "cuda" in item.keywords:
            item.add_marker(skip_cuda)
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(no_java)
    if "ddp" not in (config.option.markexpr or ""):
        ddp = [item for item in items if item.get_closest_marker("ddp")]
        if ddp:
            config.hook.pytest_deselected(items=ddp)
            items[:] = [item for item in items if not item.get_closest_marker("ddp")]


HAS_JAVA = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
NO_JAVA = "Spark needs Java (apt-get install openjdk-17-jre-headless)"


@pytest.fixture(scope="session")
def spark():
    """A local PySpark session (one core, two shuffle partitions, no UI, bound to 127.0.0.1);
    skips only when pyspark is absent (or, off CI, Java: see above)."""
    pytest.importorskip("pyspark")
    if not HAS_JAVA:  # reached under CI only
        pytest.fail(NO_JAVA)
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="torchcal-spark-")
    session = (
        SparkSession.builder.master("local[1]")
        .appName("torchcal-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", tmp)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    shutil.rmtree(tmp, ignore_errors=True)
