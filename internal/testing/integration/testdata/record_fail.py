# A program whose entry point torch.distributed.elastic's @record wraps:
# it fails, and @record writes the exception to TORCHELASTIC_ERROR_FILE,
# which gotrain puts in the root cause.
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    raise RuntimeError("loss is NaN at step 7")


if __name__ == "__main__":
    main()
