# cmake -DSOURCE_DIR=<repo> -DFOLDERS="engine;models" -DHEADERS=<regex> -DRULE=<text> -P scan_includes.cmake:
# fails naming every .h and .cpp file under FOLDERS with an #include of a header whose path starts
# with HEADERS, for rules the include roots cannot enforce (headers on system paths every target sees).
set(bad "")
foreach(folder ${FOLDERS})
  file(GLOB_RECURSE files ${SOURCE_DIR}/${folder}/*.h ${SOURCE_DIR}/${folder}/*.cpp)
  foreach(f ${files})
    file(STRINGS ${f} hits REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](${HEADERS})")
    if(hits)
      file(RELATIVE_PATH rel ${SOURCE_DIR} ${f})
      list(APPEND bad "${rel}: ${hits}")
    endif()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " lines)
  message(FATAL_ERROR "${RULE} (docs/engine.md, layering):\n  ${lines}")
endif()
message(STATUS "none: ${RULE}")
