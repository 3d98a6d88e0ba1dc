# `make demo`: set up, then make the shapes data, train (anew: an earlier demo's run folder is removed),
#   evaluate and caption on the embedded default;
#   then caption scikit-image's real sample photos with the shipped Flickr8k model (runs/photos).
# `make demo CONFIG=configs/shapes_hard.yaml`: the same with hard attention (runs/shapes_hard).
# `make test`: set up, then run the test suite (what CI runs) in two workers, a file each at a time
#   (pytest-xdist). It needs Java (METEOR, the PTB tokenizer), prints every skip with its reason and
#   fails on a skip that tests/allowed_skips.txt does not allow.
# `make test-fast`: the suite without the slow learning tests and the studies' tests (an editing loop).
# `make tables`: rewrite every study table in docs/ from the kept results (no training).
# `make kill-check`: the full fault-injection test (10 kills of prepare-features, 20 of training).
# `make browser-check`: after `make demo`, the demo's overlay page in headless Chromium (Debian's,
#   installed here if missing; not part of CI): a screenshot must show the first image's overlay.
# `make gpu-port`: sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning's models.py into third_party/sgrvinod/
#   (git-ignored), which benchmarks/gpu/gpu.py's port part times as its own code beside ours.
# `make gpu-wheels`: the wheels of the dependencies that a CUDA machine's PyTorch image lacks (Python 3.12,
#   manylinux x86-64) into gpu-wheels/ (git-ignored), for `python benchmarks/gpu/gpu.py` on a machine
#   without a network (docs/benchmarks.md, "GPU"). Needs pip and the package index, not the venv.
# `make mutate`: mutation testing (mutmut, not part of CI) of the core modules listed in setup.cfg
#   ([mutmut] only_mutate) against the fast suite: the mutants not tried yet (a stopped run goes on).
#   `make mutate MODULE=captioning.model.paper`: one module's; `STATUS=survived`: try the survivors
#   again (after new tests). Survivors: `mutmut results`, `mutmut show <name>` (docs/testing.md).
#   The session fixtures (the tiny dataset and run) are built once, unmutated, in mutants/fixtures.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= data/shapes
CONFIG ?= configs/shapes_soft.yaml
RUN ?= runs/$(basename $(notdir $(CONFIG)))
PHOTOS ?= runs/photos

.PHONY: install demo test require-java test-fast lint tables browser-check kill-check gpu-wheels gpu-port mutate clean

install: $(VENV)/.installed

# torch/torchvision are pinned here to the builds this project is tested with; setup.cfg keeps ranges.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: install
	@start=$$(date +%s); \
	$(PY) -m captioning.cli make-shapes --out $(DATA) && \
	rm -rf $(RUN) && \
	$(PY) train.py --config $(CONFIG) data.root=$(DATA) train.out_dir=$(RUN) && \
	$(PY) eval.py --checkpoint $(RUN)/best.pt --split test --out $(RUN)/metrics_test.json && \
	$(PY) -m captioning.cli caption $(DATA)/images/test/test_00000.png $(DATA)/images/test/test_00001.png \
		$(DATA)/images/test/test_00002.png --checkpoint $(RUN)/best.pt --overlays $(RUN)/overlays && \
	$(PY) -m captioning.cli sample-photos --out $(PHOTOS)/images >/dev/null && \
	$(PY) -m captioning.cli caption $(PHOTOS)/images --overlays $(PHOTOS)/overlays && \
	echo && echo "demo done in $$(( $$(date +%s) - start )) s:" && \
	echo "  data:        $(DATA) (images, COCO captions, Karpathy split, object boxes)" && \
	echo "  checkpoints: $(RUN)/best.pt, $(RUN)/last.pt" && \
	echo "  metrics:     $(RUN)/metrics_test.json; captions: $(RUN)/metrics_test_captions.json" && \
	echo "  overlays:    $(RUN)/overlays/<image>/ (a JPEG per word, grid.jpg) and index.html to browse them" && \
	echo "  real photos: $(PHOTOS)/overlays/index.html (the shipped Flickr8k model on scikit-image's photos)" && \
	echo "  tensorboard: $(VENV)/bin/tensorboard --logdir $(RUN)/tensorboard"

test: require-java install
	$(PY) -m pytest -q -rs -n 2 --dist loadfile --durations=15 --allowed-skips=tests/allowed_skips.txt

# The Java metrics must run in CI, not skip: without Java, one line says what is missing.
require-java:
	@command -v java >/dev/null 2>&1 || { echo "make test: no java on PATH; METEOR and the PTB tokenizer (tests/eval) need a Java runtime, e.g. apt-get install default-jre-headless" >&2; exit 1; }

test-fast: install
	$(PY) -m pytest -q -m "not slow and not study"

# Every study's tables in its README (studies/*/README.md), from the kept results (no training).
tables: install
	$(PY) -m studies.attention_table.run --tables-only
	$(PY) -m studies.relations.run --tables-only
	$(PY) -m studies.hard_seeds.run --tables-only
	$(PY) -m studies.position_in_features.run --tables-only
	$(PY) -m studies.scst.run --tables-only
	$(PY) -m studies.flickr8k.run --tables-only

lint: install
	$(VENV)/bin/ruff check captioning tests studies benchmarks train.py eval.py

browser-check: install
	@test -f $(RUN)/best.pt || { echo "no $(RUN)/best.pt: run make demo first"; exit 2; }
	command -v chromium >/dev/null || { apt-get update && apt-get install -y chromium; }
	$(PY) -m captioning.cli caption $(DATA)/images/test/test_00000.png $(DATA)/images/test/test_00001.png \
		$(DATA)/images/test/test_00002.png --checkpoint $(RUN)/best.pt --overlays $(RUN)/overlays
	$(PY) tests/browser_check.py $(RUN)/overlays --chromium $$(command -v chromium)

kill-check: install
	KILLS_CACHE=10 KILLS_TRAIN=20 $(PY) -m pytest -q -s tests/train/test_kills.py

gpu-wheels:
	$(PYTHON) benchmarks/gpu/gpu.py --fetch-wheels --wheels gpu-wheels

# The most used port's own code, for the port part: its models.py and licence, never committed.
PORT_REPO ?= https://github.com/sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning
gpu-port:
	rm -rf third_party/sgrvinod.clone && git clone --depth 1 $(PORT_REPO) third_party/sgrvinod.clone
	mkdir -p third_party/sgrvinod && cp third_party/sgrvinod.clone/models.py third_party/sgrvinod.clone/LICENSE \
		third_party/sgrvinod/ && git -C third_party/sgrvinod.clone rev-parse HEAD > third_party/sgrvinod/COMMIT
	rm -rf third_party/sgrvinod.clone

# One worker a core: each mutant's tests run with one torch thread (OMP_NUM_THREADS=1 below).
MODULE ?=
MUTATE_CHILDREN ?= $(shell nproc 2>/dev/null || echo 1)
# Mutants are named: a pattern ("module.*") would try again those already killed too.
mutate: install
	names=$$($(VENV)/bin/mutmut results 2>/dev/null | awk -F': ' -v status="$(STATUS)" \
	  '$$2 == (status == "" ? "not checked" : status) {print $$1}' | grep -F "$(MODULE)."); \
	if [ -z "$$names" ] && [ -d mutants ]; then echo "no $(or $(STATUS),untried) mutants of $(or $(MODULE),the core)"; \
	  exit 0; fi; \
	OMP_NUM_THREADS=1 CAPTIONING_TEST_FIXTURES=$(CURDIR)/mutants/fixtures \
	  $(VENV)/bin/mutmut run --max-children $(MUTATE_CHILDREN) \
	  $${names:-$(if $(MODULE),"$(MODULE).*")}
	$(VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) runs data mutants *.egg-info
