package safefs

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain":              `"plain"`,
		"\x1b[31mred\x1b[0m": `"\x1b[31mred\x1b[0m"`,
		"csi\u009b2J":        `"csi\u009b2J"`,
		"rtl\u202eevil":      `"rtl\u202eevil"`,
		"bad\xff":            `"bad\xff"`,
		"":                   `""`,
	} {
		assert.Equal(t, want, Quote(in), "%q", in)
	}
	long := strings.Repeat("a", MaxQuote+50)
	assert.Equal(t, `"`+strings.Repeat("a", MaxQuote)+`"...(250 bytes)`, Quote(long))
	// A cut never splits a rune: "é" is 2 bytes, so the cut falls inside one.
	s := "a" + strings.Repeat("é", MaxQuote)
	q := Quote(s)
	assert.NotContains(t, q, `\x`, "a rune cut in two shows as \\x")
	assert.True(t, utf8.ValidString(q))
	assert.Contains(t, q, "...(401 bytes)")
	assert.LessOrEqual(t, len(q), MaxQuote+30)
	// Non-printable runes are escaped even after a cut.
	assert.NotContains(t, Quote(strings.Repeat("\x1b", 1000)), "\x1b")
}

func TestCheckFS(t *testing.T) {
	assert.NoError(t, checkFS(0xef53, nil))
	assert.NoError(t, checkFS(Cgroup2Magic, []int64{CgroupMagic, Cgroup2Magic}))
	err := checkFS(0x01021994, []int64{CgroupMagic, Cgroup2Magic})
	assert.ErrorIs(t, err, ErrFileSystem)
	assert.EqualError(t, err, "file system refused: tmpfs (0x1021994), not cgroup (0x27e0eb) or cgroup2 (0x63677270)")
	assert.Equal(t, "type 0x1234", fsName(0x1234))
}

func TestFileType(t *testing.T) {
	assert.Equal(t, "a FIFO", fileType(0o010000))
	assert.Equal(t, "a character device", fileType(0o020000))
	assert.Equal(t, "type 170000", fileType(0o170000))
}
