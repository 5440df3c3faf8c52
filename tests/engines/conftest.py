import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local PySpark session (one core, two shuffle partitions, no UI, bound to 127.0.0.1);
    skips only when pyspark or Java is absent."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        message = "Spark needs Java (apt-get install openjdk-17-jre-headless)"
        if os.environ.get("CI"):  # .ci/run installs Java: there its absence is a failure
            pytest.fail(message)
        pytest.skip(message)
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
