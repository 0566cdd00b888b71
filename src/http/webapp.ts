import { createHash } from "node:crypto";
import { Hono } from "hono";
import { type BuiltApp, loadApp } from "../webapp/build.ts";
import type { AppEnv } from "./env.ts";
import { apiFailure, unroutedResponse } from "./errors.ts";
import type { Surface } from "./surface.ts";

export interface WebAppOptions {
  /** Map tiles for the GNSS track (`{z}/{x}/{y}`), when the operator configured them. */
  tileUrl?: string | undefined;
  /** Where the built app comes from (default: `dist/app`, or built at first use). */
  load?: () => Promise<BuiltApp>;
}

/** Names esbuild gives assets: `<name>-<hash>.<ext>`. */
const ASSET = /^[A-Za-z0-9_-]+-[A-Z0-9]{8}\.(js|css|svg|png)$/;

/**
 * The companion web app at `/app/`: static files, no cookies. The page is revalidated on every
 * visit (ETag) so a new build shows at once; its assets have content-hashed names and are cached
 * for a year. The policy lets the page talk only to this origin (and load tiles from the one
 * configured tile server).
 */
export function webAppSurface(o: WebAppOptions = {}): Surface {
  const load = o.load ?? loadApp;
  const tileOrigin = o.tileUrl ? new URL(o.tileUrl.replace(/\{[xyz]\}/g, "0")).origin : undefined;
  const policy = [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    `img-src 'self' data:${tileOrigin ? ` ${tileOrigin}` : ""}`,
    "connect-src 'self'",
    // The turns' recordings play from object URLs the page makes of what it fetched with the bearer.
    "media-src blob:",
    "manifest-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join("; ");
  const page = (app: BuiltApp) => {
    const html = app.index.replace("<!--config-->", o.tileUrl ? `<meta name="perch-tile-url" content="${o.tileUrl.replace(/&/g, "&amp;")}">` : "");
    return { html, etag: `"${createHash("sha256").update(html).digest("base64url").slice(0, 22)}"` };
  };
  let cached: { app: BuiltApp; html: string; etag: string } | undefined;

  const app = new Hono<AppEnv>();
  app.get("/", (c) => c.redirect("/app/", 308));
  // The page is `/app/` (a sub-application's "/" is `/app` alone), its assets `/app/assets/<name>`.
  app.get("/*", async (c) => {
    const path = c.req.path;
    if (path === "/app/") {
      const built = await load();
      if (cached?.app !== built) cached = { app: built, ...page(built) };
      const headers = {
        "cache-control": "no-cache",
        etag: cached.etag,
        "content-security-policy": policy,
        "referrer-policy": "no-referrer",
        "x-content-type-options": "nosniff",
      };
      if (c.req.header("if-none-match") === cached.etag) return c.body(null, 304, headers);
      return c.body(cached.html, 200, { ...headers, "content-type": "text/html; charset=utf-8" });
    }
    const name = path.startsWith("/app/assets/") ? path.slice("/app/assets/".length) : "";
    const file = ASSET.test(name) ? (await load()).assets.get(name) : undefined;
    if (!file) return unroutedResponse(c, []);
    return c.body(file.body as Uint8Array<ArrayBuffer>, 200, {
      "content-type": file.type,
      "cache-control": "public, max-age=31536000, immutable",
      "x-content-type-options": "nosniff",
    });
  });
  return { base: "/app", app, failure: apiFailure, unrouted: unroutedResponse };
}
