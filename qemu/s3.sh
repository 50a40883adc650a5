# Sourced by qemu/run.sh: an S3 server (SeaweedFS, scripts/seaweedfs.sh)
# on the host's loopback for the remote checkpoint tests, which the guest
# reaches at 10.0.2.2 through QEMU's user networking. s3_start ROOT starts
# it, makes the bucket and puts into the guest's root the test and its
# settings (/tests/s3.env); s3_stop ends it.

s3_start() {
	local root=$1 port="" p i
	S3_DIR=$(mktemp -d /var/tmp/branchfs-qemu-s3.XXXXXX)
	S3_KEY=branchfs-guest
	S3_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	# Eight free ports in a row: S3's and the server's others after it.
	for _ in $(seq 50); do
		p=$((20000 + RANDOM % 40000))
		for i in $(seq 0 7); do
			if (exec 3<>"/dev/tcp/127.0.0.1/$((p + i))") 2>/dev/null; then continue 2; fi
		done
		port=$p
		break
	done
	[ -n "$port" ] || { echo "qemu-test: no free ports for the S3 server" >&2; return 1; }
	"$repo/scripts/seaweedfs.sh" serve "$S3_DIR" "$port" "$S3_KEY" "$S3_SECRET" >"$S3_DIR/server.log" 2>&1 &
	S3_PID=$!
	# Ready once it makes the bucket and stores an object in it.
	local url=http://127.0.0.1:$port/guest
	for i in $(seq 1200); do
		if curl -fsS --aws-sigv4 aws:amz:us-east-1:s3 --user "$S3_KEY:$S3_SECRET" -X PUT "$url" -o /dev/null 2>/dev/null ||
			curl -fsS --aws-sigv4 aws:amz:us-east-1:s3 --user "$S3_KEY:$S3_SECRET" "$url?max-keys=1" -o /dev/null 2>/dev/null; then
			# SigV4 signs the body's hash, which curl leaves to us.
			if curl -fsS --aws-sigv4 aws:amz:us-east-1:s3 --user "$S3_KEY:$S3_SECRET" -X PUT --data-binary ready \
				-H "x-amz-content-sha256: $(printf ready | sha256sum | cut -d' ' -f1)" "$url/ready" -o /dev/null 2>/dev/null; then
				break
			fi
		fi
		kill -0 "$S3_PID" 2>/dev/null || { echo "qemu-test: the S3 server exited: $(tail -3 "$S3_DIR/server.log")" >&2; return 1; }
		[ "$i" = 1200 ] && { echo "qemu-test: the S3 server did not answer in 2 minutes" >&2; return 1; }
		sleep 0.1
	done
	cat >"$root/tests/s3.env" <<ENV
S3_URL=s3://guest
AWS_ENDPOINT_URL=http://10.0.2.2:$port
AWS_ACCESS_KEY_ID=$S3_KEY
AWS_SECRET_ACCESS_KEY=$S3_SECRET
AWS_REGION=us-east-1
AWS_EC2_METADATA_DISABLED=true
ENV
	install -m 755 "$here/criu-remote-test.sh" "$root/tests/criu-remote-test.sh"
	(cd "$repo" && CGO_ENABLED=0 go build -o "$root/tests/dropconn" ./qemu/dropconn)
	(cd "$repo" && CGO_ENABLED=0 go build -o "$root/tests/s3log" ./qemu/s3log)
	if [ -n "${BRANCHFS_CRIU_BENCH:-}" ]; then
		install -m 755 "$here/criu-remote-bench.sh" "$root/tests/criu-remote-bench.sh"
	fi
}

s3_stop() {
	if [ -n "${S3_PID:-}" ]; then
		kill -9 "$S3_PID" 2>/dev/null || true
		wait "$S3_PID" 2>/dev/null || true
	fi
	[ -z "${S3_DIR:-}" ] || rm -rf "$S3_DIR"
}
