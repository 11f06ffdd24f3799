// Package gotrainv1 is the generated Go code of gotrain's control-plane API,
// gotrain.proto beside it: the Coordinator service (agents → coordinator) and
// the Agent service (workers → their agent). Do not edit the .pb.go files;
// change the .proto and run `make proto` (CI fails when they are stale).
package gotrainv1
