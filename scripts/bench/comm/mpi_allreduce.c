// MPI_Allreduce bandwidth and latency on f32 buffers, printed like `cortado bench comm --json`
// (one JSON line per size, nccl-tests bus bandwidth), so scripts/bench/comm.sh can compare.
//   mpicc -O2 -o mpi_allreduce mpi_allreduce.c
//   mpirun -np 2 ./mpi_allreduce MIN_BYTES MAX_BYTES [LABEL] [ITERS]
// ITERS (0 or absent: about 256 MB moved, 5 to 1000) fixes the timed iterations per size.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Fewer iterations for big buffers so each size takes about the same wall time.
static int Iters(long bytes) {
  long it = (long)(256L << 20) / (bytes > 0 ? bytes : 1);
  if (it > 1000) it = 1000;
  if (it < 5) it = 5;
  return (int)it;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long lo = argc > 1 ? atol(argv[1]) : 4096, hi = argc > 2 ? atol(argv[2]) : (128L << 20);
  const char* label = argc > 3 ? argv[3] : "mpi";
  const int fixed_iters = argc > 4 ? atoi(argv[4]) : 0;
  float* buf = (float*)malloc(hi);
  for (long i = 0; i < hi / 4; ++i) buf[i] = (float)(i % 7);
  for (long bytes = lo; bytes <= hi; bytes *= 2) {
    int count = (int)(bytes / 4), iters = fixed_iters > 0 ? fixed_iters : Iters(bytes), warm = iters / 10 + 2;
    // Warm up for warm runs and at least 100 ms (rank 0 decides), like cortado bench comm.
    double w0 = MPI_Wtime();
    for (int i = 0; i < warm; ++i)
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (;;) {
      int more = MPI_Wtime() - w0 < 0.1;
      MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (!more) break;
      for (int i = 0; i < 10; ++i)
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i)
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double dt = (MPI_Wtime() - t0) / iters, worst;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      double algbw = bytes / worst / 1e9, busbw = algbw * 2.0 * (size - 1) / size;
      printf("{\"op\":\"allreduce\",\"algo\":\"%s\",\"ranks\":%d,\"bytes\":%ld,\"time_us\":%.2f,"
             "\"algbw\":%.4f,\"busbw\":%.4f}\n",
             label, size, bytes, worst * 1e6, algbw, busbw);
      fflush(stdout);
    }
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
