import { createHash } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";

/** The repository's root, and where the web app's sources and its build live. */
const ROOT = new URL("../../", import.meta.url).pathname;
export const APP_SOURCE = join(ROOT, "app");
export const APP_BUILD = join(ROOT, "dist", "app");
/** The most JavaScript the app may ship (contract: at most 300 KiB). */
export const MAX_JS_BYTES = 300 * 1024;

export interface BuiltFile {
  body: Uint8Array;
  type: string;
}

/** The built app: `index.html` (revalidated) and hashed assets (cached for a year). */
export interface BuiltApp {
  /** Hash of the sources and dependency versions it was built from. */
  source: string;
  index: string;
  /** Asset file name (`main-<hash>.js`) → contents. */
  assets: Map<string, BuiltFile>;
  jsBytes: number;
}

const TYPES: Record<string, string> = {
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
};

function typeOf(name: string): string {
  return TYPES[name.slice(name.lastIndexOf("."))] ?? "application/octet-stream";
}

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)]));
}

/** A hash of everything a build depends on: the app's sources and the locked dependency versions. */
export function sourceHash(): string {
  const h = createHash("sha256");
  for (const f of files(APP_SOURCE).sort()) h.update(relative(APP_SOURCE, f)).update("\0").update(readFileSync(f)).update("\0");
  try {
    h.update(readFileSync(join(ROOT, "package-lock.json")));
  } catch {
    // Installed without a lock file: the sources alone decide.
  }
  return h.digest("hex").slice(0, 16);
}

/** Bundles the app with esbuild (minified, hashed names) in memory. */
export async function buildApp(): Promise<BuiltApp> {
  const esbuild = await import("esbuild");
  const source = sourceHash();
  const result = await esbuild.build({
    entryPoints: { main: join(APP_SOURCE, "src", "main.tsx") },
    bundle: true,
    splitting: true,
    format: "esm",
    target: ["es2022", "chrome100", "safari16", "firefox110"],
    minify: true,
    sourcemap: false,
    write: false,
    outdir: "/assets",
    entryNames: "[name]-[hash]",
    chunkNames: "[name]-[hash]",
    assetNames: "[name]-[hash]",
    jsx: "automatic",
    jsxImportSource: "preact",
    metafile: true,
    legalComments: "none",
    logLevel: "silent",
    absWorkingDir: ROOT,
  });
  const assets = new Map<string, BuiltFile>();
  let jsBytes = 0;
  let script = "";
  let style = "";
  for (const out of result.outputFiles) {
    const name = out.path.slice(out.path.lastIndexOf("/") + 1);
    assets.set(name, { body: out.contents, type: typeOf(name) });
    if (name.endsWith(".js")) jsBytes += out.contents.byteLength;
    if (name.startsWith("main-") && name.endsWith(".js")) script = name;
    if (name.startsWith("main-") && name.endsWith(".css")) style = name;
  }
  if (!script) throw new Error("the web app build produced no main script");
  if (jsBytes > MAX_JS_BYTES) throw new Error(`the web app's JavaScript is ${jsBytes} bytes, over the ${MAX_JS_BYTES}-byte budget`);
  const template = readFileSync(join(APP_SOURCE, "index.html"), "utf8");
  const index = template
    .replace("<!--style-->", style ? `<link rel="stylesheet" href="assets/${style}">` : "")
    .replace("<!--script-->", `<script type="module" src="assets/${script}"></script>`);
  return { source, index, assets, jsBytes };
}

/** Writes a build to `dir` (replacing what was there) with a manifest naming its source hash. */
export function writeApp(app: BuiltApp, dir = APP_BUILD): void {
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(join(tmp, "assets"), { recursive: true });
  for (const [name, file] of app.assets) writeFileSync(join(tmp, "assets", name), file.body);
  writeFileSync(join(tmp, "index.html"), app.index);
  writeFileSync(join(tmp, "manifest.json"), `${JSON.stringify({ source: app.source, js_bytes: app.jsBytes }, null, 2)}\n`);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, ".."), { recursive: true });
  renameSync(tmp, dir);
}

/** The build in `dir` when it was made from the current sources; undefined otherwise. */
export function readApp(dir = APP_BUILD): BuiltApp | undefined {
  try {
    const manifest = JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8")) as { source: string; js_bytes: number };
    if (manifest.source !== sourceHash()) return undefined;
    const assets = new Map<string, BuiltFile>();
    for (const name of readdirSync(join(dir, "assets"))) {
      const path = join(dir, "assets", name);
      if (statSync(path).isFile()) assets.set(name, { body: readFileSync(path), type: typeOf(name) });
    }
    return { source: manifest.source, index: readFileSync(join(dir, "index.html"), "utf8"), assets, jsBytes: manifest.js_bytes };
  } catch {
    return undefined;
  }
}

let loading: Promise<BuiltApp> | undefined;

/**
 * The app, as `npm install` built it (`dist/app`); built here, in memory, when that build is
 * missing or was made from other sources (and written back when the directory is writable).
 */
export function loadApp(): Promise<BuiltApp> {
  loading ??= (async () => {
    const built = readApp();
    if (built) return built;
    const app = await buildApp();
    try {
      writeApp(app);
    } catch {
      // A read-only installation serves the build from memory.
    }
    return app;
  })();
  loading.catch(() => (loading = undefined));
  return loading;
}

// `node src/webapp/build.ts` (the `prepare` script, run by `npm install`): build and write.
if (import.meta.url === `file://${process.argv[1]}`) {
  const app = await buildApp();
  writeApp(app);
  process.stdout.write(`web app built: ${app.assets.size} files, ${(app.jsBytes / 1024).toFixed(1)} KiB of JavaScript\n`);
}
