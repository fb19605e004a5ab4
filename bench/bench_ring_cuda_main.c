/* bench_ring_cuda as a program of its own (bench_ring_cuda.c), for machines without MPI. */
int bench_ring_cuda(int argc, char **argv);

int main(int argc, char **argv) { return bench_ring_cuda(argc, argv); }
