/* Calls into the interpreter that a thread ended by the exiting interpreter survives.
 *
 * Python 3.11 ends a thread that asks for the GIL once finalizing has begun with `pthread_exit`,
 * whose forced unwinding runs up the thread's stack. Reaching a Rust frame that catches unwinds
 * (a fan-out's branch, a PyO3 method), or one whose unwind table says it cannot unwind there,
 * it aborts the process. Each call below runs inside a pthread cleanup handler that parks the
 * thread for good instead: the unwinding stops in this frame, before any Rust frame above it.
 * The process is ending; nobody waits for the thread's work, and it holds no lock of
 * Python's (`take_gil` lets go of everything before it ends the thread).
 *
 * Written in C because the cleanup handler is C's (`pthread_cleanup_push`), compiled with
 * `-fexceptions` so that it costs nothing on the way through: a landing pad, not a `setjmp`.
 * Python's own types are opaque here; the signatures are the stable ABI's. */

#include <pthread.h>
#include <stddef.h>
#include <unistd.h>

typedef struct _object PyObject;

extern PyObject *PyObject_Vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames);
extern int PyIter_Send(PyObject *iter, PyObject *arg, PyObject **presult);
extern int PyGILState_Ensure(void);

static void park_for_good(void *unused) {
    (void)unused;
    for (;;) {
        pause();
    }
}

PyObject *soma_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                          PyObject *kwnames) {
    PyObject *out;
    pthread_cleanup_push(park_for_good, NULL);
    out = PyObject_Vectorcall(callable, args, nargsf, kwnames);
    pthread_cleanup_pop(0);
    return out;
}

int soma_iter_send(PyObject *iter, PyObject *arg, PyObject **presult) {
    int sent;
    pthread_cleanup_push(park_for_good, NULL);
    sent = PyIter_Send(iter, arg, presult);
    pthread_cleanup_pop(0);
    return sent;
}

int soma_gil_ensure(void) {
    int state;
    pthread_cleanup_push(park_for_good, NULL);
    state = PyGILState_Ensure();
    pthread_cleanup_pop(0);
    return state;
}
