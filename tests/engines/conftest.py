import os
import shutil
import tempfile

import pytest

HAS_JAVA = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
NO_JAVA = "Spark needs Java (apt-get install openjdk-17-jre-headless)"


def pytest_collection_modifyitems(items):
    """Off CI, a machine without Java skips the tests that take the ``spark`` fixture; under CI
    (``.ci/run`` installs Java) the fixture fails instead, so a missing Java is never a skip."""
    marker = pytest.mark.skipif(not HAS_JAVA and not os.environ.get("CI"), reason=NO_JAVA)
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(marker)


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
