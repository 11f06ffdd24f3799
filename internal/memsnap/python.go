package memsnap

import _ "embed"

// PythonModule is gotrain_snapshot.py, the module PyTorch programs import:
// snapshot(state_dict, step) and restore() over the same socket and memfds.
//
//go:embed gotrain_snapshot.py
var PythonModule []byte

// PythonModuleName is the file name PythonModule goes by on a worker's path.
const PythonModuleName = "gotrain_snapshot.py"
