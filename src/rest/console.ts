import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { extname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { GatewayError } from "../domain/errors.js";
import type { NodeRequest, NodeResponse } from "./body.js";

/**
 * The market console (GET /console): static files from src/console/ (copied to dist/ by the
 * build), served by the REST facade before its route table. No build chain: the browser loads
 * the ES modules as they are.
 */

/** The path prefix everything of the console lives under. */
export const consolePath = "/console";

/**
 * What every console answer carries. The page loads only its own files and talks only to this
 * origin: no inline script or style (an offer's provider-written metadata cannot run as code
 * even if it ever reached the DOM as markup), no frames, no form posts, no base rewrite.
 */
export const consoleSecurityHeaders: Readonly<Record<string, string>> = {
  "content-security-policy": [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join("; "),
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
  // The file names carry no content hash, so a browser revalidates each load (an ETag
  // answers 304): after an upgrade no module is older than the page that imports it.
  "cache-control": "no-cache",
};

const contentTypes: Readonly<Record<string, string>> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
};

interface Asset {
  readonly bytes: Buffer;
  readonly type: string;
  readonly etag: string;
}

/** The console's files, read once; `serve` answers a request for one of them. */
export interface ConsoleAssets {
  /** The URL paths served, `/console` (the page) first. */
  readonly paths: readonly string[];
  /**
   * Answers `pathname` when it is a console file (true), else leaves the request alone
   * (false). Methods other than GET and HEAD on a console path are `method_not_allowed`.
   */
  serve(req: NodeRequest, res: NodeResponse, pathname: string): boolean;
}

/** The folder of the console's files beside this module (src/console, or dist/src/console). */
export const consoleDir = fileURLToPath(new URL("../console/", import.meta.url));

/**
 * Reads the console's files into memory: a few kilobytes, and no file system path is ever
 * built from a request (a request names a key of the map or nothing). Files of other types
 * than {@link contentTypes} are not served.
 */
export function createConsoleAssets(dir: string = consoleDir): ConsoleAssets {
  const assets = new Map<string, Asset>();
  const walk = (folder: string): void => {
    for (const entry of readdirSync(folder, { withFileTypes: true })) {
      const path = join(folder, entry.name);
      if (entry.isDirectory()) {
        walk(path);
        continue;
      }
      const type = contentTypes[extname(entry.name)];
      if (type === undefined) continue;
      const bytes = readFileSync(path);
      const etag = `"${createHash("sha256").update(bytes).digest("base64url").slice(0, 22)}"`;
      assets.set(`${consolePath}/${relative(dir, path).split(sep).join("/")}`, {
        bytes,
        type,
        etag,
      });
    }
  };
  if (existsSync(dir)) walk(dir);
  const page = assets.get(`${consolePath}/index.html`);
  if (page !== undefined) {
    assets.set(consolePath, page);
    assets.set(`${consolePath}/`, page);
  }

  return {
    paths: [...assets.keys()].sort((a, b) => a.length - b.length || a.localeCompare(b)),
    serve(req, res, pathname) {
      const asset = assets.get(pathname);
      if (asset === undefined) return false;
      if (req.method !== "GET" && req.method !== "HEAD")
        throw new GatewayError("method_not_allowed", `${req.method} is not allowed on ${pathname}`);
      req.resume();
      const headers = { ...consoleSecurityHeaders, etag: asset.etag };
      if (req.headers["if-none-match"] === asset.etag) {
        res.writeHead(304, headers);
        res.end();
        return true;
      }
      res.writeHead(200, {
        ...headers,
        "content-type": asset.type,
        "content-length": asset.bytes.length,
      });
      if (req.method === "HEAD") res.end();
      else res.end(asset.bytes);
      return true;
    },
  };
}
