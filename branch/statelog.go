package branch

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The state log (STORE/log) is the store's memory: one line per event,
// appended. A create or abort is one unsynced append; a commit is one
// synced append (the commit's journal) before anything moves, and one more
// once it is done. Each line carries a checksum, so a torn last line reads
// as never written. Mounting replays the log, finishes a commit that has
// no "done", and rewrites the log as a snapshot.

type logOp string

const (
	logBranch logOp = "branch" // snapshot of one branch (or main's epoch)
	logCreate logOp = "create"
	logAbort  logOp = "abort"
	logCommit logOp = "commit" // the journal: the commit will complete
	logDone   logOp = "done"   // every step of the commit has happened
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

type stateLog struct{ f *os.File }

func openStateLog(path string) (*stateLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return &stateLog{f: f}, nil
}

// append writes one record; durable ones reach the disk before it returns.
func (l *stateLog) append(r *logRecord, durable bool) error {
	line, err := encodeRecord(r)
	if err != nil {
		return err
	}
	if _, err := l.f.Write(line); err != nil {
		return err
	}
	if durable {
		return unix.Fdatasync(int(l.f.Fd()))
	}
	return nil
}

func (l *stateLog) close() error { return l.f.Close() }

// writeSnapshot replaces the log with the given records, durably.
func writeSnapshot(path string, recs []logRecord) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for i := range recs {
		line, err := encodeRecord(&recs[i])
		if err != nil {
			f.Close()
			return err
		}
		w.Write(line)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
