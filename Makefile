# The two commands: `make demo` and `make test`. Both bootstrap .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.logsdk-installed
# The pyspark the tests run: the newest release whose Kafka connector
# (spark-sql-kafka-0-10_2.13) Maven Central serves; logsdk/testing/spark_kafka/pom.xml names
# the same version (tests/unit/test_spark_jars.py checks both).
PYSPARK := 4.2.0

.PHONY: demo test lint typecheck docs unit bench chaos clean plots jars

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv  # uv: installs in seconds where pip takes minutes
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[dev,spark,site]' 'pyspark==$(PYSPARK)'  # spark: tests/spark; site: tests/site
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The full suite on the main Python (.venv), several tests at a time (xdist; each worker
# starts its own brokers on free ports): the fault tests (kills, pauses, cuts) in a run of
# their own, apart from the CPU-heavy rest; then the unit and integration suites on the
# other supported Pythons (noxfile.py).
# The documentation site (docs/, mkdocs.yml): a broken link, a missing page or a setting
# the configuration reference does not describe fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir .site

# Each stage has a deadline (coreutils timeout) well past its usual time, so that a stage
# stuck outside any test (pytest-timeout covers each test) fails CI with its name.
# Four xdist workers on 2 cores: the tests spend much of their time waiting on brokers,
# servers and timed outages (the non-fault tests took 6:26 against 7:30-8:22 with two, the
# fault tests 5:46 against 7:40; six made the non-fault stage no faster and Spark's Python
# workers time out). The Spark cluster test runs
# alone: its five JVMs beside other Spark tests made their Python workers time out
# connecting back ("Python worker failed to connect back"), seen with -n 2.
# Apache Kafka's jars, Spark's Kafka connector and hadoop-aws (with the AWS SDK bundle,
# about 690 MB) from Maven Central into the jar cache (logsdk/testing/_jars.py), once:
# the suite runs its Kafka-facing tests on Apache Kafka too and the Spark tests on
# Spark's own Kafka source and s3a:// checkpoints, so Java 17+ and Maven are needed, and
# their absence stops make test here with a message rather than in the tests.
jars: $(STAMP)
	@command -v java >/dev/null 2>&1 || { echo "make test needs a Java 17+ runtime (no java on PATH): Apache Kafka and Spark run in the suite; e.g. apt-get install openjdk-17-jre-headless" >&2; exit 1; }
	@command -v mvn >/dev/null 2>&1 || { echo "make test needs Maven (no mvn on PATH): it fetches Apache Kafka's jars, Spark's Kafka connector and hadoop-aws from Maven Central; e.g. apt-get install maven" >&2; exit 1; }
	$(VENV)/bin/logsdk broker --kind apache --fetch-jars
	$(PY) -m logsdk.testing._spark

# Each stage's timeout is a hard stop for a hang, not a target: the non-fault stage took
# from 8:28 to 18:52 in fresh clones on this 2-core machine (2026-11-28, the same suite).
test: lint typecheck docs jars
	@echo "== Python $$($(PY) -c 'import platform; print(platform.python_version())') (.venv): full suite, fault tests apart"
	timeout -k 30 30m $(VENV)/bin/pytest -n 4 -m "not fault and not spark_cluster" --durations=20
	timeout -k 30 20m $(VENV)/bin/pytest -n 4 -m "fault and not three_nodes" --durations=20
	@echo "== Three-node Apache Kafka: one worker for the fault tests' clusters, one for the rebalance tests' shared cluster"
	timeout -k 30 30m $(VENV)/bin/pytest -n 2 --dist loadgroup -m three_nodes --durations=20
	@echo "== A Spark standalone cluster (a master, two workers), alone on the machine"
	timeout -k 30 15m $(VENV)/bin/pytest -m spark_cluster --durations=20
	@echo "== Pythons 3.10, 3.12, 3.13 (nox): unit and integration suites"
	timeout -k 30 30m $(VENV)/bin/nox

unit: $(STAMP)
	$(VENV)/bin/pytest tests/unit

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# The pictures in the docs drawn from measurements (matplotlib, the `plots` extra): a
# producer through a 10 s network cut (about a minute), and the benchmark ratios of
# benchmarks/results.json.
plots: $(STAMP)
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[plots]'
	$(PY) benchmarks/outage_timeline.py
	$(PY) benchmarks/plot_results.py

SEED ?= 1
DURATION ?= 300
chaos: $(STAMP)
	$(PY) -m logsdk.testing.chaos --duration $(DURATION) --seed $(SEED) --results benchmarks/results.json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info .site .nox
