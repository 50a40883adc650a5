// Package remote moves branches, and the checkpoint images paired with
// them, through S3-compatible object storage, so that a branch made on one
// host can be pulled onto a mount of a copy of the same base on another.
// It builds nothing of its own for distribution: an object store that
// every fleet already runs is the transport, the cache and the catalogue.
//
// Layout of a bucket. A push to s3://BUCKET/DIR/NAME writes
//
//	DIR/NAME           the manifest (manifest.go): gzip'd JSON, written last
//	DIR/.chunks/HASH   content chunks, named by the SHA-256 of their bytes
//
// so everything pushed under one DIR shares its chunks: a file that two
// branches hold, or that two pushes of a branch hold, is stored once. A
// chunk is whole or absent (one PUT each), and the manifest goes in only
// after every chunk it names, by one PUT, so a reader never sees a
// manifest with a missing chunk; a push that stops on the way leaves only
// chunks, which the next push finds and skips (resuming).
//
// Chunks are cut by content (chunk.go), so an insertion in a large file
// moves only the chunks around it, not every chunk after it; a large file
// is many chunks, uploaded in parallel and each retried alone, which is
// what S3's multipart upload would give, with the parts deduplicated and
// no upload ID to keep for a resume.
//
// What a branch assumes of its base. Each manifest entry records the
// version its parent showed at that path when it was pushed: absent, or a
// type, with size and SHA-256 for a file and the target for a symlink. A
// pull compares them with the parent it pulls onto and refuses, naming
// the paths, where they differ (unless forced): the branch would
// otherwise carry a change made against another file.
//
// How a pull makes the branch: through the daemon, never behind it. It
// creates the branch by the control file, then makes each path through
// the new branch's view as a program would (unlink for a deletion, rmdir
// and mkdir for an opaque directory, writes for files), so copy-up,
// tombstones and the store's format stay the daemon's business; a pull
// that fails aborts the branch it made.
package remote
