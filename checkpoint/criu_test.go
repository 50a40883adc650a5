package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without a working CRIU every memory command fails at once, with one
// line that says what is needed.
func TestUnavailableSaysWhatIsNeeded(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "criu")
	script := "#!/bin/sh\necho 'Error (criu/util.c:642): exited, status=1' >&2\necho 'Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable' >&2\nexit 1\n"
	if err := os.WriteFile(broken, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ criu, want string }{
		{filepath.Join(dir, "missing"), "no criu binary found"},
		{broken, "vdso: Failed to fill self vdso symtable"},
	} {
		t.Setenv(EnvCRIU, c.criu)
		_, err := probe()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s: %v", c.criu, err)
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, c.want) || !strings.Contains(msg, "CRIU 4.1") {
			t.Fatalf("%s: not one line saying what is needed: %q", c.criu, msg)
		}
	}
}
