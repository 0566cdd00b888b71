import { readFileSync } from "node:fs";

const root = new URL("../", import.meta.url);

/** The package version and, when known, the commit it was built from (`PERCH_BUILD_COMMIT`, else the checkout's HEAD). */
export function buildInfo(): { version: string; commit: string } {
  const { version } = JSON.parse(readFileSync(new URL("package.json", root), "utf8")) as { version: string };
  return { version, commit: process.env.PERCH_BUILD_COMMIT || gitHead() || "unknown" };
}

function gitHead(): string | undefined {
  try {
    const head = readFileSync(new URL(".git/HEAD", root), "utf8").trim();
    if (!head.startsWith("ref: ")) return head;
    const ref = head.slice(5);
    try {
      return readFileSync(new URL(`.git/${ref}`, root), "utf8").trim();
    } catch {
      const packed = readFileSync(new URL(".git/packed-refs", root), "utf8");
      return packed
        .split("\n")
        .find((l) => l.endsWith(` ${ref}`))
        ?.split(" ")[0];
    }
  } catch {
    return undefined;
  }
}
