package branch

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The state log (STORE/log) is the store's memory: one line per event,
// appended. A create or abort is one append; a commit is one append (the
// commit's journal, flushed to the disk first when the store is durable)
// before anything moves, and one more once it is done; a commit that rolls
// back erases its journal instead. Each line carries a checksum, so a torn
// last line reads as never written. Mounting replays the log, finishes (or
// else rolls back) a commit that has no "done", and rewrites the log as a
// snapshot.

type logOp string

const (
	logBranch logOp = "branch" // snapshot of one branch (or main's epoch)
	logCreate logOp = "create"
	logAbort  logOp = "abort"
	logCommit logOp = "commit" // the journal: the commit completes, or rolls back whole
	logDone   logOp = "done"   // every step of the commit has happened
	// logUndone: the commit was rolled back, when records came after its
	// journal, which therefore could not be erased.
	logUndone logOp = "undone"
	// logFinished is a snapshot's record of one of the latest finished
	// branches, which list --all shows (Store.history); an abort's and a
	// done's Finished add the others.
	logFinished logOp = "finished"
	// logLimit sets a branch's own storage limit (Store.SetLimit).
	logLimit logOp = "limit"
)

type logRecord struct {
	Op          logOp     `json:"op"`
	Name        string    `json:"name"`
	Parent      string    `json:"parent,omitempty"`
	ParentEpoch uint64    `json:"parent_epoch,omitempty"`
	Epoch       uint64    `json:"epoch,omitempty"`
	Committed   bool      `json:"committed,omitempty"`
	Created     time.Time `json:"created,omitzero"`
	NewEpoch    uint64    `json:"new_epoch,omitempty"` // the parent's, after a commit
	Ops         []op      `json:"ops,omitempty"`
	// Stage is the commit's stage directory on the target's mount: what
	// step i replaces moves there, to TAG-i, so that a rollback can put it
	// back (stage.go).
	Stage string `json:"stage,omitempty"`
	Tag   string `json:"tag,omitempty"`
	// StageIno is the inode number of a stage in the base, which is the
	// commit's own (stage.go); 0 for the store's stage.
	StageIno uint64 `json:"stage_ino,omitempty"`
	// AutoName, in main's snapshot record, is the last generated name's
	// number, so that no generated name comes back (Store.freeName).
	AutoName int `json:"auto_name,omitempty"`
	// Copied: the store is on another mount than the base, and each step
	// moves into the base a copy made in the stage (stage.go), not the
	// delta's own entry.
	Copied bool `json:"copied,omitempty"`
	// Finished is when the branch of an abort, a done or a finished record
	// ended.
	Finished time.Time `json:"finished,omitzero"`
	// MaxStorage is a branch's own storage limit, in a limit record and
	// a snapshot's branch record.
	MaxStorage int64 `json:"max_storage,omitempty"`
}

func encodeRecord(r *logRecord) ([]byte, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "%08x %s\n", crc32.ChecksumIEEE(data), data), nil
}

// readLog returns the records up to the first torn or corrupt line.
func readLog(path string) ([]logRecord, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var recs []logRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<30)
	for sc.Scan() {
		line := sc.Bytes()
		var sum uint32
		if len(line) < 10 || line[8] != ' ' {
			break
		}
		if _, err := fmt.Sscanf(string(line[:8]), "%08x", &sum); err != nil || crc32.ChecksumIEEE(line[9:]) != sum {
			break
		}
		var r logRecord
		if err := json.Unmarshal(line[9:], &r); err != nil {
			break
		}
		recs = append(recs, r)
	}
	return recs, sc.Err()
}

// The log file keeps a zero-filled, allocated tail that records are
// written into, so a synced append flushes data only, never the file's
// size or block map: on ext4 that is the difference between waiting for a
// journal commit and not.
const logChunk = 1 << 20

type stateLog struct {
	f    *os.File
	off  int64 // where the next record goes
	size int64 // allocated length of the file
	last int64 // where the last record appended starts; -1 if none
}

// append writes one record; durable ones reach the disk before it returns.
// It returns where the record starts, for erase.
func (l *stateLog) append(r *logRecord, durable bool) (int64, error) {
	at := l.off
	line, err := encodeRecord(r)
	if err != nil {
		return at, err
	}
	if err := l.reserve(int64(len(line))); err != nil {
		return at, err
	}
	l.last = at
	if _, err := l.f.WriteAt(line, at); err != nil {
		return at, err
	}
	l.off += int64(len(line))
	if durable {
		return at, unix.Fdatasync(int(l.f.Fd()))
	}
	return at, nil
}

// reserve makes sure that the next n bytes of records are allocated, so
// that writing them needs no free space. A commit reserves its own record
// and the "done" after it before moving anything.
func (l *stateLog) reserve(n int64) error {
	if l.off+n <= l.size {
		return nil
	}
	grow := max(logChunk, n)
	if _, err := l.f.WriteAt(make([]byte, grow), l.size); err != nil {
		return err
	}
	if err := l.f.Sync(); err != nil {
		return err
	}
	l.size += grow
	return nil
}

// erase unwrites the last record, which starts at at: zeros read as the
// log's end, so the record was never written. A commit that rolled back
// erases its journal. Zeros torn half-way still break the record's checksum.
// It fails if another record came after.
func (l *stateLog) erase(at int64) error {
	if at != l.last {
		return errors.New("not the last record")
	}
	if _, err := l.f.WriteAt(make([]byte, l.off-at), at); err != nil {
		return err
	}
	l.off = at
	return unix.Fdatasync(int(l.f.Fd()))
}

func (l *stateLog) close() error { return l.f.Close() }

// writeSnapshot replaces the log with the given records and a zero-filled
// tail, durably, and returns it open for appending. Once the new log is in
// place it is returned even with an error (of the directory's sync): the
// old one is gone, and appends must go to the new one.
func writeSnapshot(path string, recs []logRecord) (*stateLog, error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*stateLog, error) {
		f.Close()
		return nil, err
	}
	w := bufio.NewWriter(f)
	var end int64
	for i := range recs {
		line, err := encodeRecord(&recs[i])
		if err != nil {
			return fail(err)
		}
		w.Write(line)
		end += int64(len(line))
	}
	w.Write(make([]byte, logChunk))
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	l := &stateLog{f: f, off: end, size: end + logChunk, last: -1}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return l, err
	}
	defer d.Close()
	return l, d.Sync()
}
