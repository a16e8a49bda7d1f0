# Thin wrapper over CMake presets. `make demo` and `make test` work on a fresh Debian machine.
JOBS ?= $(shell nproc)
PRESET ?= release
FUZZ_SECONDS ?= 20
# make test fuzzes each reader this long (seconds; make fuzz: FUZZ_SECONDS)
FUZZ_TEST_SECONDS ?= 10
BUILD := build

.PHONY: all deps configure build demo demo-lm test bench clean fuzz sanitize

all: build

deps:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake --preset $(PRESET)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	bash scripts/demo.sh

# A small language model on Shakespeare's plays: tokenizer, shards, DeltaNet [0,1] vs [-1,1], a
# generated sample (~4 min).
demo-lm: build
	bash scripts/demo_lm.sh

test: build
	# Passive waiting: ctest runs tests side by side, and spinning OpenMP threads would steal the cores.
	cd $(BUILD) && OMP_WAIT_POLICY=passive ctest --output-on-failure -j $(JOBS) --timeout 900
	# The same suite (but the learning tests) under ASan + UBSan, then every reader fuzzed briefly.
	bash scripts/sanitize.sh
	bash scripts/fuzz.sh $(FUZZ_TEST_SECONDS)

bench: build
	$(BUILD)/bench/bench_train_step --benchmark_min_time=2 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

sanitize: deps
	bash scripts/sanitize.sh

fuzz: deps
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) build-debug build-cuda build-fuzz
