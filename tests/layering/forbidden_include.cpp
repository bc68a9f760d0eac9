// Compiled once per (part, header) pair by tests/layering/CMakeLists.txt, linked to that part only:
// the allowed header must be found through the part's include roots and the forbidden one must not.
#include DUET_ALLOWED_HEADER
#ifdef DUET_FORBIDDEN_HEADER
#include DUET_FORBIDDEN_HEADER
#endif
