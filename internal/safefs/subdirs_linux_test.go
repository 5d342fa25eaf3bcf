package safefs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSubDirs: the directories of a directory, not its files nor its
// symlinks (to a directory included); more than max is ErrTooLarge; a
// file, a missing name and a symlinked parent are errors.
func TestSubDirs(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"top/a", "top/b", "top/c/deeper"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "top/file"), nil, 0o644))
	require.NoError(t, os.Symlink(filepath.Join(dir, "top/a"), filepath.Join(dir, "top/link")))
	require.NoError(t, os.Symlink(filepath.Join(dir, "top"), filepath.Join(dir, "toplink")))
	d, err := OpenDir(dir, InRoot|NoSymlinks)
	require.NoError(t, err)
	defer d.Close()

	names, err := d.SubDirs("top", 10)
	require.NoError(t, err)
	sort.Strings(names)
	assert.Equal(t, []string{"a", "b", "c"}, names)

	_, err = d.SubDirs("top", 2)
	assert.ErrorIs(t, err, ErrTooLarge)
	_, err = d.SubDirs("top/file", 10)
	assert.Error(t, err)
	_, err = d.SubDirs("none", 10)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = d.SubDirs("toplink", 10)
	assert.True(t, errors.Is(err, ErrSymlink), "%v", err)
}
