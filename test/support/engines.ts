/** The embedded speech engines the servers of this test process share (one pair per process). */
export { embeddedEngines as engines } from "../../src/server.ts";
