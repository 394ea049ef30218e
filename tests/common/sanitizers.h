// Which sanitizer a test binary was built with, for tests whose deadlines must allow for it.
// GCC defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__; clang has the __has_feature tests.
#pragma once

namespace moebatch::test {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

/// True in any sanitizer build (ASan + UBSan or TSan): code runs several times slower there.
inline constexpr bool kSanitizerBuild = kThreadSanitizer || kAddressSanitizer;

}  // namespace moebatch::test
