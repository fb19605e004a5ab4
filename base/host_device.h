/* One qualifier for helpers that compile unchanged as C on the host and in CUDA kernels. */
#ifndef RINGATTN_BASE_HOST_DEVICE_H
#define RINGATTN_BASE_HOST_DEVICE_H

#if defined(__CUDACC__)
#define RA_HD static __host__ __device__ __forceinline__
#else
#define RA_HD static inline
#endif

#endif
