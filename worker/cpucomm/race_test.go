//go:build race

package cpucomm

// raceDetector: the tests run under the race detector (go test -race).
const raceDetector = true
