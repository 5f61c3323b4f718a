// The library a compiled-core consumer program links (KOLO_CONSUMER_LINK: kolo_lib or
// kolo_lib_shared), in a file of its own so that lib_main.cpp compiles once for both programs.
#ifndef KOLO_CONSUMER_LINK
#define KOLO_CONSUMER_LINK "unknown"
#endif

extern const char* const kolo_consumer_link;
const char* const kolo_consumer_link = KOLO_CONSUMER_LINK;
