package branch

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MainName is the branch that shows the base directory itself.
const MainName = "main"

// NameMax is the longest branch name, in bytes: a branch's view is the
// directory entry "@NAME", which, as every file name, holds at most
// NAME_MAX (255) bytes. Generated names, which the create ioctl returns
// in a 128-byte buffer, are far shorter.
const NameMax = 254

// ValidateName accepts what a file name may be, as far as the branch's
// view and its delta directory are file names and the name travels in
// JSON: 1 to NameMax bytes of UTF-8, not "." or "..", without "/" or NUL.
// Spaces, "+", "@", a leading "." and any letter are fine; Quote shows a
// name safely in messages and the control file's protocol.
func ValidateName(name string) error {
	switch {
	case len(name) == 0 || len(name) > NameMax:
		return fmt.Errorf("%w %s: must be 1 to %d bytes", ErrInvalidName, Quote(name), NameMax)
	case name == "." || name == "..":
		return fmt.Errorf("%w %s", ErrInvalidName, Quote(name))
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("%w %s: holds %q", ErrInvalidName, Quote(name), name[strings.IndexAny(name, "/\x00")])
	case !utf8.ValidString(name):
		return fmt.Errorf("%w %s: not UTF-8", ErrInvalidName, Quote(name))
	}
	return nil
}

// Quote is name as messages show it: as it is when it is plain (printable,
// no space, quote or backslash), else as a quoted Go string, which shows
// every byte and cannot be confused with the words around it.
func Quote(name string) string {
	if name == "" {
		return `""`
	}
	for _, r := range name {
		if r == utf8.RuneError || r == '"' || r == '\\' || r == '\'' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return strconv.Quote(name)
		}
	}
	return name
}
