package logattr

import "strconv"

// MiB writes b bytes in MiB (2^20 bytes) with one decimal and a space, as
// memctl's sentences do: "318.5 MiB". A negative b keeps its sign.
func MiB(b int64) string { return mib(b) + " MiB" }

// AppendMiB appends MiB(b) to dst, allocating only to grow dst.
func AppendMiB(dst []byte, b int64) []byte {
	return append(strconv.AppendFloat(dst, float64(b)/(1<<20), 'f', 1, 64), " MiB"...)
}

// MiBCompact writes b bytes in MiB with one decimal and no space, as the
// startup line writes GOMEMLIMIT: "318.5MiB".
func MiBCompact(b int64) string { return mib(b) + "MiB" }

func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }
