# One-command set-up: `make train` (main job) and `make test` create the venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamp names the requirements' hash, so editing requirements.txt re-installs, and nothing
# else does (re-running is a no-op).
REQ_HASH := $(shell sha1sum requirements.txt setup.py | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(REQ_HASH)
PIP := $(BIN)/python -m pip --disable-pip-version-check
TRAIN_CONFIG ?= config/train_ppo.yaml
# A new run directory per `make train` (expanded once, so every step of the job sees the same).
RUN_STAMP := $(shell date +%Y%m%d-%H%M%S)
RUN_DIR ?= runs/$(RUN_STAMP)
# Extra arguments of the train graph, e.g. TRAIN_ARGS='--actors 4 --num-envs 64 --teacher x.pt'.
TRAIN_ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv sysdeps train train-rough train-offline test docs bench bench-sac bench-opd bench-ros mutation clean-venv

venv: $(STAMP)

# Offscreen rendering (gait GIFs) on CPU-only machines needs Mesa's OSMesa library.
sysdeps:
	@dpkg -s libosmesa6 >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libosmesa6; \
	  else echo 'missing libosmesa6 (offscreen rendering): sudo apt-get install libosmesa6'; \
	    exit 1; fi; }

$(STAMP): requirements.txt setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements.txt
	$(BIN)/python -c "import torch, sys; sys.exit('torch is a CUDA build: ' + torch.__version__ + '; install the CPU wheel torch==2.13.0') if torch.version.cuda else None"
	$(PIP) install -q --no-deps --no-build-isolation -e .
	# Byte-code of the package's sources, read by every node process at start-up even where
	# PYTHONDONTWRITEBYTECODE keeps Python from writing it (a stale one is ignored).
	$(BIN)/python -m compileall -q claw_rl_ros > /dev/null
	rm -f $(VENV)/.installed-*
	touch $@

# The main job: train the claw quadruped from scratch live over the ROS 2 graph (trainer node,
# two batched actor nodes, the realtime sim + policy control loop; `claw-rl up train` is
# `ros2 launch claw_rl_ros train.launch.py`), export student.onnx and evaluate it at 0.5 m/s,
# then render its gait.
# Two actors of 128 worlds: together the config's 256, the batch offline learns from (with 256
# each the student first walked at a median 50 s of training instead of 31 s, docs/benchmarks.md).
# TRAIN_NUM_ENVS=0 gives each actor the config's env.num_envs (e.g. with another TRAIN_CONFIG).
TRAIN_NUM_ENVS ?= 128
train: venv sysdeps
	$(BIN)/claw-rl up train --config $(TRAIN_CONFIG) --run-dir $(RUN_DIR) \
	  --num-envs $(TRAIN_NUM_ENVS) $(TRAIN_ARGS)
	$(BIN)/claw-rl eval --model $(RUN_DIR)/student.onnx --config $(TRAIN_CONFIG) \
	  --command 0.5 0 0 --episodes 1 --gif $(RUN_DIR)/gait.png

# The terrain job: (1) a privileged teacher that sees the terrain (height scan) trained in one
# process, the fast path (config/train_rough_teacher.yaml); (2) the blind student trained live
# over the ROS 2 graph like the main job, distilled online from that frozen teacher
# (PPO + alpha * KL(teacher || student), config/train_rough.yaml: the student remembers its
# last 10 observations and trains 2,280 s, then the best of its last students on a validation
# set becomes student.onnx; 52 minutes for all of it, measured); then the student's evaluation
# on the terrain tiles it has to walk on. The student trains overlapped (actors
# collect while the trainer learns): the main job's synchronous default ran no more iterations
# on this job (526 against 535 in 1,140 s, 2026-12-06; docs/changelog.md).
ROUGH_DIR ?= runs/rough-$(RUN_STAMP)
ROUGH_ALPHA ?= 1.0
train-rough: venv sysdeps
	$(BIN)/claw-rl train --config config/train_rough_teacher.yaml --run-dir $(ROUGH_DIR)/teacher
	$(BIN)/claw-rl up train --config config/train_rough.yaml --run-dir $(ROUGH_DIR)/student \
	  --teacher $$(ls -v $(ROUGH_DIR)/teacher/checkpoints/model_*.pt | tail -1) \
	  --set distillation.alpha=$(ROUGH_ALPHA) --overlap true $(TRAIN_ARGS)
	$(BIN)/claw-rl eval --model $(ROUGH_DIR)/student/student.onnx --config config/train_rough.yaml \
	  --command 0.5 0 0 --episodes 20 --terrain all

# The same training in one process (the fast path; also SAC: TRAIN_CONFIG=config/train_sac.yaml).
train-offline: venv sysdeps
	$(BIN)/claw-rl train --config $(TRAIN_CONFIG) --run-dir $(RUN_DIR)

# pytest exit 5 (no test collected) means the suite is broken: fail on it like any other error.
# The suite builds the docs too (test/test_docs.py): sphinx and myst-parser come with the venv.
test: venv sysdeps
	@$(BIN)/python -m pytest test $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo 'pytest collected no tests: failing'; exit 1; fi; exit $$rc

# The docs site (Sphinx + MyST, the pages of docs/) into docs/_build/html; warnings are errors.
docs: venv
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html

# Benchmarks print ratios measured side by side; stable-baselines3 is a bench-only dependency.
bench: venv
	$(PIP) install -q -r requirements-bench.txt
	$(BIN)/python bench/env_throughput.py
	$(BIN)/python bench/ppo_vs_sb3.py

# SAC vs stable-baselines3 SAC (Pendulum-v1, Hopper-v5; 2 seeds) and SAC vs PPO on the claw
# quadruped at equal training time (docs/sac_vs_ppo_claw.png). Over an hour on 2 idle cores at
# these budgets; `SAC_BENCH_ARGS=--quick` is a smoke run. Results: docs/sac_results.md.
SAC_BENCH_ARGS ?=
bench-sac: venv
	$(PIP) install -q -r requirements-bench.txt
	$(BIN)/python bench/sac_vs_sb3.py $(SAC_BENCH_ARGS)

# The ROS control loop: lockstep vs a bare ping-pong, realtime latency with hot swaps, and the
# newest runs/*/student.onnx walking through the loop (a few minutes; wants an idle machine).
bench-ros: venv
	$(BIN)/python bench/ros_control.py

# OPD vs PPO from scratch (trains PPO with evaluations, then a distilled student): ~15 minutes.
bench-opd: venv
	$(BIN)/python bench/opd_vs_ppo.py

# Mutation testing of the core maths (not in CI): every mutant of ppo, opd, storage, networks,
# env, observations, rewards and export runs against the fast tests that reach it (setup.cfg
# [mutmut]); prints the score per module and the surviving mutants. One thread per worker.
MUTATION_JOBS ?= 2
mutation: venv
	$(PIP) install -q -r requirements-dev.txt
	rm -rf mutants
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(MUTATION_JOBS) \
	  > mutants.log 2>&1 || { tail -n 40 mutants.log; exit 1; }
	$(BIN)/python tools/mutation_report.py

clean-venv:
	rm -rf $(VENV)
