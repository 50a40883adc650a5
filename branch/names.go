package branch

import (
	"fmt"
	"unicode/utf8"
)

// MainName is the branch that shows the base directory itself.
const MainName = "main"

// NameMax is the longest branch name; it must fit the 128-byte ioctl buffer
// with its terminating NUL.
const NameMax = 127

// ValidateName accepts 1 to 127 bytes of [A-Za-z0-9._-], not starting with '.'.
func ValidateName(name string) error {
	if len(name) == 0 || len(name) > NameMax {
		return fmt.Errorf("%w %q: must be 1 to %d bytes", ErrInvalidName, name, NameMax)
	}
	if name[0] == '.' {
		return fmt.Errorf("%w %q: must not start with '.'", ErrInvalidName, name)
	}
	for i, c := range name {
		if c == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(name[i:]); size == 1 {
				return fmt.Errorf("%w %q: byte %#x is not one of [A-Za-z0-9._-]", ErrInvalidName, name, name[i])
			}
		}
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w %q: character %q is not one of [A-Za-z0-9._-]", ErrInvalidName, name, c)
		}
	}
	return nil
}
