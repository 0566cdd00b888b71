// Loaded into every test file's process (package.json's test scripts). Node's test runner, told to
// force the exit (--test-force-exit, which @roamhq/wrtc needs), exits a file's process while the
// last of its results may still wait in the pipe to the runner, and they are lost without a word
// (nodejs/node#64833: fewer tests reported, a failure's name and error missing). Writes to a
// blocking pipe are never left behind.
process.stdout._handle?.setBlocking?.(true);
