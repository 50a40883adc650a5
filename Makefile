GO      ?= go
BIN     := bin/branchfs

.PHONY: build demo test test-deps go-test cover-branch check bench qemu-test qemu-test-debug clean

# Without cgo: the only C the binary would link is the libc user and DNS
# lookups of os/user and net, which branchfs never reaches, and the
# dynamic loading costs each CLI call about 3.5 ms (15.3 against 11.7 ms
# for a create, measured).
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/branchfs

# Mounts a generated workspace, tries three fixes in three branches and
# commits the one whose test passes. Needs root (FUSE) and /dev/fuse.
demo: build
	./demo/demo.sh $(BIN)

# Everything CI runs, from a fresh machine (root): installs what is
# missing, then the checks, the Go suite and the guest's suite, in order.
test: test-deps
	$(MAKE) check
	$(MAKE) go-test
	$(MAKE) qemu-test

test-deps:
	./scripts/test-deps.sh

# Every filesystem test mounts for real; they need root and /dev/fuse.
# The race detector's runtime sleeps a second in every process it ends
# (atexit_sleep_ms), and the tests run the race-built CLI hundreds of times.
# The remote/ tests run SeaweedFS's S3 server, built once per version
# (scripts/seaweedfs.sh: about 20 minutes the first time; BRANCHFS_SKIP_S3=1
# skips those tests).
go-test: test-deps
	weed=$$([ -n "$$BRANCHFS_SKIP_S3" ] || ./scripts/seaweedfs.sh) && \
	BRANCHFS_WEED="$$weed" GORACE="atexit_sleep_ms=0 $$GORACE" $(GO) test -race -count=1 -timeout 20m ./...

# Statement coverage of branch/ by its own tests, which need no FUSE, run
# as an ordinary user (uid 65534 when run as root); fails below COVER_MIN
# (85). Prints each file's figure and the tests that skipped.
cover-branch:
	GO=$(GO) ./scripts/cover-branch.sh

# The benchmark suite of bench/: branchfs against native ext4 and
# fuse-overlayfs in one run. Needs root; writes bench/results/.
bench:
	command -v fuse-overlayfs >/dev/null && command -v cc >/dev/null || (apt-get update -qq && apt-get install -y -qq fuse-overlayfs gcc)
	$(GO) run ./bench

# The branch() system call: builds the patched kernel (cached under
# /var/cache/branchfs-qemu), boots it under QEMU with the tests in an
# initramfs, prints every result and "N passed, N failed". Needs root.
qemu-test:
	./qemu/deps.sh
	./qemu/run.sh

# The same tests on a debug kernel (KASAN, lockdep, atomic-sleep and list
# checks: qemu/kernel-debug.config); any report in its log fails the run.
qemu-test-debug:
	./qemu/deps.sh
	BRANCHFS_QEMU_DEBUG=1 ./qemu/run.sh

check:
	test -z "$$(gofmt -l .)"
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

clean:
	rm -rf bin
