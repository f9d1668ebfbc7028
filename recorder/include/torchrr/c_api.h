/* A C interface to the recorder, for bindings (the Python package loads it with ctypes into a
 * process where torch is already loaded). Every function is thread-safe and never fails loudly:
 * trouble prints one warning on stderr and the call returns a non-zero value. */
#ifndef TORCHRR_C_API_H_
#define TORCHRR_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One recording option: `name` is its Python keyword (recording_options.def: native_stacks,
 * keep_last, steps, ...), `value` its text as its TORCHRR_* variable takes it ("1", "3", "2:5",
 * "drop"); an option that is a flag of `torchrr record` also takes a switch word (true sets what
 * the flag sets, false the default: drop_when_full=1). */
typedef struct torchrr_setting {
  const char* name;
  const char* value;
} torchrr_setting;

typedef struct torchrr_options {
  const char* path;                 /* The trace; NULL: torchrr.trr. */
  int rank;                         /* The distributed rank; -1 reads RANK. */
  const torchrr_setting* settings;  /* The options given; the others take their defaults. */
  size_t setting_count;
  char* error;                      /* Where a refused option says why (NULL: not said). */
  size_t error_size;
} torchrr_options;

/* Starts recording as `options` says. An option not given takes its default: RecorderOptions'
 * (recording_options.def), except C++ stacks, off when this process runs a Python interpreter.
 * Returns 0 when recording; 1 when not (already recording, or the file could not be opened: a
 * warning says which); 2 when an option is unknown, its value not understood, or it needs or
 * excludes another (options->error says which; nothing is printed and nothing starts). */
int torchrr_start_with(const torchrr_options* options);

/* What torchrr_start_with(options) would record with, without starting: one line per option,
 * "keyword=value" in recording_options.def's order, into `out` (at most `size` bytes with the
 * terminating NUL). Returns torchrr_start_with's 0, or its 2 (options->error says why). */
int torchrr_describe_options(const torchrr_options* options, char* out, size_t size);

/* Marks the start of a training step in the active recording (Recorder::Step). */
void torchrr_step(void);

/* The fingerprint (kernels/fingerprint.h, as --verify-saved takes them) of `bytes` bytes at `data`:
 * host memory when `device` is -1, else memory of CUDA device `device`, hashed on its current
 * stream after the work queued there. Returns 0, or 1 when a CUDA call failed or the build has no
 * CUDA. torchrr record --locate-write compares a saved tensor's bytes with it (torchrr/_locate.py).
 */
int torchrr_fingerprint(const void* data, size_t bytes, int device, uint64_t* fingerprint);

/* Names the nn.Module whose forward now runs on the calling thread (OpRecord.module_path:
 * "layers.1.mlp (LlamaMLP)"), for the ops it starts until the next call; NULL or "" for none.
 * Ignored when nothing records. Python's module hooks call it (torchrr/_modules.py). */
void torchrr_set_module(const char* module);

/* Returns once what the active recording recorded so far is in its trace file on disk
 * (Recorder::Flush). Returns 0, or 1 when nothing records or the trace could not be written. */
int torchrr_flush(void);

/* Starts recording as `torchrr record` asked through the environment: TORCHRR_OUTPUT (the trace;
 * FILE.rankN.trr when RANK=N is set) and one TORCHRR_* variable per option, as
 * recording_options.def names them (environment_options.h). An unset variable takes its
 * default: RecorderOptions' (recorder.h), except C++ stacks, off when this process runs a Python
 * interpreter. Returns 0 when recording; 1 when TORCHRR_OUTPUT is unset or empty
 * (silently), already recording or the file could not be opened (a warning says which). A value
 * not understood prints a warning and takes the default. Reads the environment as getenv does:
 * not safe against a concurrent setenv. */
int torchrr_start_from_environment(void);

/* Stops the recording started by either function above and closes the trace; in a forked child
 * that follows (TORCHRR_FOLLOW_FORKS), the child's own recording. Returns 0, or 1 when nothing was
 * recording. */
int torchrr_stop(void);

/* 1 while a recording started by either function above records. */
int torchrr_recording(void);

/* Records an error (kind: 0 C++ exception, 1 Python exception, 2 uncaught) with its type name
 * and message into the active recording. No-op when nothing records. */
void torchrr_record_error(int kind, const char* type, const char* message);

/* Ops recorded so far by the active recording. */
uint64_t torchrr_ops_recorded(void);

/* How Python stacks are read in this process: "frames" (the interpreter's frames read directly:
 * CPython 3.11, while they agree with the API's) or "api" (through frame objects, under the GIL).
 * A diagnostic: both give the same stacks. */
const char* torchrr_python_stack_walker(void);

#ifdef __cplusplus
}
#endif

#endif /* TORCHRR_C_API_H_ */
