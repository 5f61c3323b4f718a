// kernels_tu.cu — the one .cu file of a program whose other files are plain C++: including
// kolo/cuda/kernels.cuh here registers kolo's device fusion kernels for the whole program.
#include <kolo/cuda/kernels.cuh>
