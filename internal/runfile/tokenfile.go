package runfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// WriteToken writes a job token that the node starting the coordinator
// made into Dir() as RUN_ID.token, mode 0600, for the person starting the
// other nodes to copy: the join hint names the file instead of printing the
// token. Remove it when the job ends.
func WriteToken(runID, tok string) (*File, error) {
	dir, err := MakeDir() // privdir.go
	if err != nil {
		return nil, fmt.Errorf("run-file dir: %w", err)
	}
	Clean(dir) // what launchers that were SIGKILLed left, with their tokens
	name := strings.ReplaceAll(runID, string(os.PathSeparator), "_")
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.token", name, os.Getpid()))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("write the job token file: %w", err)
	}
	_, err = f.WriteString(tok + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("write the job token file: %w", err)
	}
	return &File{path: path}, nil
}
