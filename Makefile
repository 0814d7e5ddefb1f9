# vgpu-bridge — `make help` lists the targets.
SHELL        := /bin/bash
.SHELLFLAGS  := -eu -o pipefail -c
GO           ?= go
# The version: the nearest tag (git describe), else the VERSION file's
# release as a development version of the commit (PEP 440 style, as
# OpenStack's pbr writes it).
COMMIT       ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
VERSION      ?= $(shell git describe --tags --dirty 2>/dev/null || echo "$$(cat VERSION).dev0+$(COMMIT)")
LDFLAGS      := -X github.com/vgpu-bridge/vgpu-bridge/internal/version.version=$(VERSION) \
                -X github.com/vgpu-bridge/vgpu-bridge/internal/version.commit=$(COMMIT)
BINARIES     := vgpu-bridge vgpu-agent vgpuctl
TEST_TIMEOUT ?= 40m
# The slowest test packages (real Nova), named first: go test starts the
# packages it is given in that order, so these run from the start and the
# others beside them rather than after them.
SLOW_TEST_PKGS ?= ./tests/e2e ./tests/pipeline ./tests/novaharness
TEST_FUZZTIME ?= 2s
# The lab's tests (tests/lab, build tag lab): the lab VM's boot included.
LAB_TEST_TIMEOUT ?= 60m
LAB_TEST_FLAGS ?= -v
# The lab's slowest cases, left to `make lab-test` (which runs them all):
# `make test` still runs at least one case of each thing the lab proves
# (live hot-plug through the bridge, the vendor-VFIO attach, Nova's own
# libvirt driver, the lab VM's restart). tests/README.rst names them.
LAB_SLOW_TESTS ?= ^(TestAnsiblePlaybook|TestAgentKilledAfterCreateResumes|TestAgentKilledAfterCreateExpiredRollsBack|TestAgentProfileChangeSwapsVGPU|TestAgentConfigAttachSurvivesRestart)$$
FUZZTIME     ?= 1m
DEB_DIR      ?= build/deb
IMAGE_DIR    ?= build/image
IMAGE_NAME   ?= localhost/vgpu-bridge
AGENT_IMAGE_NAME ?= localhost/vgpu-agent
IMAGE_ARCH   ?= $(shell $(GO) env GOARCH)
export PATH  := /usr/local/go/bin:$(PATH)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "; printf "Targets:\n"} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the three binaries into bin/
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))

.PHONY: services
services: ## Install (apt) and start Postgres, RabbitMQ, Placement and Keystone for tests and the demo
	bash tests/services.sh

.PHONY: test
test: services ## Start the services, run unit and integration tests with the race detector and, beside them, each fuzz target briefly, then the lab's tests but its slowest (LAB_SLOW_TESTS: `make lab-test` runs them all; the lab VM is powered off at the end)
	@# The fuzz targets run beside the go test packages (at a lower CPU
	@# priority: the packages spend much of their time waiting on Nova and
	@# the other services), their output printed after the packages'; so
	@# does the lab's build (its packages installed first: apt must not run
	@# beside TestInstall's dpkg; the modules and the nested guest's kernel
	@# compiled at the lowest priority, on what the tests leave idle). The
	@# lab's VM and tests come after both (CPU-heavy: they must not share
	@# the machine with the packages). Each phase runs even when one before
	@# failed, so a run reports all three, and the target fails when any
	@# did. The lab's tests run verbose: the log shows what each took.
	@rc=0; fuzzlog=$$(mktemp); lablog=$$(mktemp); \
	bash tests/lab/lab.sh install || echo "lab: lab.sh install failed; the lab's up tries again"; \
	nice -n 10 bash tests/fuzz.sh $(TEST_FUZZTIME) >"$$fuzzlog" 2>&1 & fuzz=$$!; \
	LAB_NO_APT=1 nice -n 19 bash tests/lab/lab.sh build >"$$lablog" 2>&1 & labbuild=$$!; \
	CI=$${CI:-} $(GO) test -race -timeout $(TEST_TIMEOUT) -count=1 $(SLOW_TEST_PKGS) ./... || rc=1; \
	wait $$fuzz || rc=1; cat "$$fuzzlog"; rm -f "$$fuzzlog"; \
	wait $$labbuild || echo "lab: the build beside the go tests failed; the lab's up tries again"; \
	cat "$$lablog"; rm -f "$$lablog"; \
	( $(call lab_test_down,-v -skip '$(LAB_SLOW_TESTS)') ) || rc=1; \
	exit $$rc

.PHONY: lab
lab: ## Bring up the lab VM (tests/lab/lab.sh up: Debian's kernel, systemd, libvirtd, sample mdev drivers under QEMU)
	bash tests/lab/lab.sh up

.PHONY: lab-down
lab-down: ## Power the lab VM off
	bash tests/lab/lab.sh down

.PHONY: lab-test
lab-test: services ## Run the tests against the lab VM (brings it up first and leaves it up; `make test` runs them too)
	$(GO) test -tags lab -timeout $(LAB_TEST_TIMEOUT) -count=1 $(LAB_TEST_FLAGS) ./tests/lab/

.PHONY: lab-test-down
lab-test-down: services ## As lab-test, then power the lab VM off, also when a test failed (as `make test` does)
	@$(call lab_test_down,$(LAB_TEST_FLAGS))

# lab_test_down FLAGS: the lab VM up (apt and module build when missing:
# outside the tests' own time limit), the lab's tests, then the VM powered
# off whatever their outcome, and the time each took. A lab that does not
# come up fails every test (TestMain tries once more and says why). Inline
# rather than a sub-make: `make -n test` must not run the tests.
define lab_test_down
start=$$(date +%s); \
	trap 'bash tests/lab/lab.sh down; echo "lab: up, tests and down took $$(( $$(date +%s) - start )) s"' EXIT; \
	bash tests/lab/lab.sh up || echo "lab: lab.sh up failed; the lab's tests will fail"; \
	echo "lab: up after $$(( $$(date +%s) - start )) s"; \
	$(GO) test -tags lab -timeout $(LAB_TEST_TIMEOUT) -count=1 $(1) ./tests/lab/
endef

.PHONY: fuzz
fuzz: ## Run every Go fuzz target for FUZZTIME each (default 1m)
	bash tests/fuzz.sh $(FUZZTIME)

.PHONY: bench
bench: services ## Run Go benchmarks and the load harnesses under tests/bench (prints figures and ratios)
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...
	@for d in tests/bench/*/; do \
	  [ -f "$$d/main.go" ] || continue; \
	  echo "== $$d"; $(GO) run "./$$d" ; \
	done

.PHONY: lint
lint: ## go vet, gofmt check, staticcheck when it installs
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@if $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -version >/dev/null 2>&1; then \
	  $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...; \
	else echo "staticcheck not available from the module proxy; skipped"; fi

.PHONY: genconfig
genconfig: ## Regenerate the sample configs, the sample access policy and their docs' references from the definitions
	@mkdir -p etc/vgpu-bridge doc/source/reference
	$(GO) run ./cmd/vgpu-bridge genconfig --config '' -o etc/vgpu-bridge/bridge.conf.sample
	$(GO) run ./cmd/vgpu-agent genconfig --config '' -o etc/vgpu-bridge/agent.conf.sample
	$(GO) run ./cmd/vgpu-bridge genconfig --config '' --format rst -o doc/source/reference/bridge-config.rst
	$(GO) run ./cmd/vgpu-bridge genpolicy --config '' -o etc/vgpu-bridge/policy.yaml.sample
	$(GO) run ./cmd/vgpu-bridge genpolicy --config '' --format rst -o doc/source/reference/policy.rst
	$(GO) run ./cmd/vgpu-agent genconfig --config '' --format rst -o doc/source/reference/agent-config.rst

.PHONY: deb
deb: ## Debian packages of vgpu-bridge, vgpu-agent and vgpuctl into DEB_DIR (default build/deb; dpkg-deb; lintian checks them)
	@mkdir -p $(DEB_DIR)/bin
	@# -bindnow: Go's own linker links these two (no cgo), so CGO_LDFLAGS'
	@# -z now alone never reached them (lintian: hardening-no-bindnow).
	CGO_LDFLAGS='-Wl,-z,relro,-z,now' $(GO) build -trimpath -buildmode=pie -ldflags '-bindnow $(LDFLAGS)' -o $(DEB_DIR)/bin/ ./cmd/vgpu-bridge ./cmd/vgpuctl
	@# The agent without -z now: go-nvml leaves NVML's symbols to lazy binding
	@# (the library is dlopen'ed at run time, when present), so with BIND_NOW
	@# the dynamic loader refuses to start the binary on every host
	@# (packaging/deb/vgpu-agent.lintian-overrides says so to lintian).
	CGO_LDFLAGS='-Wl,-z,relro' $(GO) build -trimpath -buildmode=pie -ldflags '$(LDFLAGS)' -o $(DEB_DIR)/bin/ ./cmd/vgpu-agent
	bash packaging/deb/build.sh '$(VERSION)' $(DEB_DIR)/bin $(DEB_DIR)

.PHONY: image
image: ## OCI image archive of vgpu-bridge into IMAGE_DIR (default build/image; static, no shell, no container daemon)
	@mkdir -p $(IMAGE_DIR)
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -buildvcs=false -ldflags '-s -w $(LDFLAGS)' -o $(IMAGE_DIR)/vgpu-bridge ./cmd/vgpu-bridge
	GOOS= GOARCH= $(GO) run ./packaging/oci -binary $(IMAGE_DIR)/vgpu-bridge -etc etc/vgpu-bridge -arch $(IMAGE_ARCH) \
	  -version '$(VERSION)' -revision "$$(git rev-parse HEAD 2>/dev/null || echo $(COMMIT))" -name $(IMAGE_NAME) \
	  -o '$(IMAGE_DIR)/vgpu-bridge-$(VERSION).oci.tar'

.PHONY: image-agent
image-agent: ## OCI image archive of vgpu-agent into IMAGE_DIR (cgo: libvirt's client library and what it needs, for this machine's architecture; see doc/source/install.rst for its mounts)
	@mkdir -p $(IMAGE_DIR)
	@# Built as for the Debian package (make deb), and for the same reason
	@# without -z now: NVML is the host's library, bound lazily when present.
	CGO_LDFLAGS='-Wl,-z,relro' $(GO) build -trimpath -buildvcs=false -buildmode=pie -ldflags '-s -w $(LDFLAGS)' -o $(IMAGE_DIR)/vgpu-agent ./cmd/vgpu-agent
	$(GO) run ./packaging/oci -daemon vgpu-agent -closure -binary $(IMAGE_DIR)/vgpu-agent -etc etc/vgpu-bridge \
	  -version '$(VERSION)' -revision "$$(git rev-parse HEAD 2>/dev/null || echo $(COMMIT))" -name $(AGENT_IMAGE_NAME) \
	  -o '$(IMAGE_DIR)/vgpu-agent-$(VERSION).oci.tar'

.PHONY: docs
docs: ## Build the documentation (doc/source) with Sphinx into doc/build/html, warnings as errors
	sphinx-build -W -q -b html doc/source doc/build/html

.PHONY: demo
demo: services build ## Run the main job against the local services (see README)
	bash tests/demo.sh

.PHONY: clean
clean: ## Remove build outputs
	rm -rf bin
