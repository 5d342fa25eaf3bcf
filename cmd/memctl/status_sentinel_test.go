package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/thp"
)

// Issue 32: no status field shows a sentinel as a number. thp.Settings
// says "file absent" with PMDSize 0 and MaxPTEsNone -1; the JSON document
// printed "pmd_size_bytes": 0 and "max_ptes_none": -1 for a kernel without
// those files. They are null now; the table says "absent" (as before) and
// names no huge page size it does not know.
func TestStatusTHPFieldsAbsent(t *testing.T) {
	st := &statusReport{THPSystem: thpSystemOf(thp.Settings{Enabled: "always", PMDEnabled: "inherit", Defrag: "madvise", MaxPTEsNone: -1})}
	b, err := json.Marshal(st.THPSystem)
	require.NoError(t, err)
	assert.JSONEq(t, `{"enabled":"always","pmd_enabled":"inherit","defrag":"madvise","pmd_size_bytes":null,"max_ptes_none":null}`, string(b))
	var out bytes.Buffer
	writeTable(&out, st)
	assert.Regexp(t, `(?m)^THP system +always$`, out.String())
	assert.Regexp(t, `(?m)^khugepaged/max_ptes_none +absent$`, out.String())
	assert.NotContains(t, out.String(), "-1")
	assert.NotContains(t, out.String(), "hugepages-0kB")

	st = &statusReport{THPSystem: thpSystemOf(thp.Settings{Enabled: "madvise", PMDEnabled: "inherit", Defrag: "madvise", PMDSize: 2 << 20, MaxPTEsNone: 511})}
	b, err = json.Marshal(st.THPSystem)
	require.NoError(t, err)
	assert.JSONEq(t, `{"enabled":"madvise","pmd_enabled":"inherit","defrag":"madvise","pmd_size_bytes":2097152,"max_ptes_none":511}`, string(b))
	out.Reset()
	writeTable(&out, st)
	assert.Regexp(t, `(?m)^THP system +madvise \(hugepages-2048kB: inherit\)$`, out.String())
	assert.Regexp(t, `(?m)^khugepaged/max_ptes_none +511$`, out.String())
}
