# Two commands on a fresh machine with Python >= 3.11: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test ui browser servers clean mutation

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/optimizer-pipeline demo

# two test processes (pytest-xdist), each taking whole files, the longest first (tests/conftest.py):
# most tests wait on subprocesses and servers. TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 2
test: $(STAMP) browser servers
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# headless Chromium + chromedriver for the UI test (Debian packages; installed when missing)
browser:
	bash .ci/ensure-chromium

# redis-server and PostgreSQL binaries for the tests that start throwaway servers (installed when missing)
servers:
	bash .ci/ensure-servers

ui: $(STAMP)
	$(BIN)/optimizer-pipeline ui

clean:
	rm -rf $(VENV) .optimizer .pytest_cache

# Mutation testing (TESTING.md): mutmut over the modules whose rules the product stands on, each in
# a scratch copy of the work tree (.mutation/<module>/: the tree itself is never mutated) against
# the tests that matter for it. Slow, so not part of `make test`. `make mutation MUTATION_MODULES=uq`
# runs one module; MUTATION_TIMEOUT caps each module's run (s); MUTATION_JOBS = parallel mutants.
MUTATION_MODULES ?= uq outcomes recommend verify ledger local arx transform
MUTATION_TIMEOUT ?= 5400
MUTATION_JOBS ?= 1
MUT_uq := optimizer_pipeline/uq.py
MUT_uq_TESTS := tests/test_uq_rules.py tests/test_uq_scores.py tests/test_boundaries.py tests/test_model_local.py
MUT_outcomes := optimizer_pipeline/outcomes.py
MUT_outcomes_TESTS := tests/test_outcomes.py tests/test_boundaries.py tests/test_outcomes_ledger.py
MUT_recommend := optimizer_pipeline/recommend.py
MUT_recommend_TESTS := tests/test_recommend.py tests/test_settings.py
MUT_verify := optimizer_pipeline/solver/verify.py
MUT_verify_TESTS := tests/test_verify.py tests/test_boundaries.py
MUT_ledger := optimizer_pipeline/ledger/repository.py optimizer_pipeline/ledger/base.py
MUT_ledger_TESTS := tests/test_ledger.py tests/test_ledger_candidates.py tests/test_ledger_race.py
# record_solve / finish_run are @retried wrappers of _record_solve / _finish_run (mutmut skips decorated functions);
# the run write they share with a what-if is base.py's
MUT_ledger_ONLY := *record_solve__mutmut_* *_solve_write__mutmut_* *_publish__mutmut_* *_expire__mutmut_* *finish_run__mutmut_* \
  *_run_write__mutmut_* *_insert_run_row__mutmut_*
MUT_local := optimizer_pipeline/model/local.py
MUT_local_TESTS := tests/test_model_local.py
# the model's block-scoring path (stacked runs, one-step residuals, the held disturbance's filter, the
# block errors); the rest of arx.py is identification's, covered by the judge and the model tests
MUT_arx := optimizer_pipeline/model/arx.py
MUT_arx_TESTS := tests/test_model_arx.py tests/test_uq_scores.py
MUT_arx_ONLY := *stack_runs__mutmut_* *one_step_residuals__mutmut_* *disturbance_filter__mutmut_* \
  *fit_disturbance__mutmut_* *held_errors__mutmut_* *_filtered__mutmut_*
MUT_transform := optimizer_pipeline/contracts/transform.py
MUT_transform_TESTS := tests/test_cv_transform.py

define mutate_module
	rm -rf .mutation/$(1) && mkdir -p .mutation/$(1)
	git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C .mutation/$(1)
	printf '[mutmut]\nsource_paths = optimizer_pipeline\npytest_add_cli_args = -p no:cacheprovider\nonly_mutate =\n' > .mutation/$(1)/setup.cfg
	for f in $(MUT_$(1)); do printf '    %s\n' $$f >> .mutation/$(1)/setup.cfg; done
	printf 'pytest_add_cli_args_test_selection =\n' >> .mutation/$(1)/setup.cfg
	for t in $(MUT_$(1)_TESTS); do printf '    %s\n' $$t >> .mutation/$(1)/setup.cfg; done
	cd .mutation/$(1) && (nice -n 10 timeout $(MUTATION_TIMEOUT) $(CURDIR)/$(BIN)/mutmut run --max-children $(MUTATION_JOBS) $(foreach n,$(MUT_$(1)_ONLY),'$(n)') > run.log 2>&1; echo "exit $$?" >> run.log)
	cd .mutation/$(1) && $(CURDIR)/$(BIN)/mutmut results --all true 2>/dev/null | grep -E "$(subst *,.*,$(subst $(space),|,$(or $(MUT_$(1)_ONLY),.)))" > results.txt || true
	@cd .mutation/$(1) && printf '%s: %s killed, %s survived, %s timeout, %s suspicious, %s not checked, %s without tests, %s other (of %s); survivors in .mutation/%s/results.txt\n' $(1) \
	  $$(grep -c ': killed$$' results.txt) $$(grep -c ': survived$$' results.txt) $$(grep -c ': timeout$$' results.txt) \
	  $$(grep -c ': suspicious$$' results.txt) $$(grep -c ': not checked$$' results.txt) $$(grep -c ': no tests$$' results.txt) \
	  $$(grep -vcE ': (killed|survived|timeout|suspicious|not checked|no tests)$$' results.txt) $$(wc -l < results.txt) $(1) | tee -a $(CURDIR)/.mutation/summary.txt

endef
space := $(subst ,, )

mutation: $(STAMP)
	mkdir -p .mutation && printf 'make mutation at %s (%s), MUTATION_JOBS=%s\n' "$$(git rev-parse --short HEAD)" "$$(date -u +%FT%TZ)" $(MUTATION_JOBS) > .mutation/summary.txt
	$(foreach m,$(MUTATION_MODULES),$(call mutate_module,$(m)))
