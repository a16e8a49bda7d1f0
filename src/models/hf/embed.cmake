# Embeds every *.py of a folder into a C++ header, byte for byte (cmake -P script, run at build
# time by the rule in the top-level CMakeLists.txt):
#   cmake -DSRC_DIR=<folder> -DOUT=<header> -P embed.cmake
# The header defines lrnn::hf::embedded::kFiles, {name, data, size} per file (data as byte
# values, so the files may hold any characters), ending with {"", nullptr, 0}.
if(NOT SRC_DIR OR NOT OUT)
  message(FATAL_ERROR "embed.cmake: pass -DSRC_DIR=<folder> -DOUT=<header>")
endif()
file(GLOB files LIST_DIRECTORIES false RELATIVE "${SRC_DIR}" "${SRC_DIR}/*.py")
list(SORT files)
set(arrays "")
set(table "")
set(i 0)
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 byte16)  # CMake's regex has no {n}
foreach(name IN LISTS files)
  if(NOT name MATCHES "^[A-Za-z0-9_.-]+$")
    message(FATAL_ERROR "embed.cmake: ${SRC_DIR}/${name}: file names may hold only letters, digits, '_', '.', '-'")
  endif()
  file(SIZE "${SRC_DIR}/${name}" size)
  file(READ "${SRC_DIR}/${name}" hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  # 16 bytes a line; a trailing 0 keeps the array non-empty for an empty file (size says the length).
  string(REGEX REPLACE "(${byte16})" "\\1\n    " bytes "${bytes}")
  string(APPEND arrays "// ${name}\ninline constexpr unsigned char kData${i}[] = {\n    ${bytes}0x00};\n")
  string(APPEND table "    {\"${name}\", kData${i}, ${size}},\n")
  math(EXPR i "${i} + 1")
endforeach()
set(text "// Generated from ${SRC_DIR}/*.py by embed.cmake at build time: do not edit.
#pragma once
#include <cstddef>

namespace lrnn::hf::embedded {

struct File {
  const char* name;
  const unsigned char* data;
  std::size_t size;
};

${arrays}
inline constexpr File kFiles[] = {
${table}    {\"\", nullptr, 0},
};

}  // namespace lrnn::hf::embedded
")
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
