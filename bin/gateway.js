#!/usr/bin/env node
// The `gateway` command: the production build's CLI, in this process (no loader, no npx chain).
import { existsSync } from "node:fs";
import { fileURLToPath, URL } from "node:url";

const main = new URL("../dist/src/cli/main.js", import.meta.url);
if (!existsSync(fileURLToPath(main))) {
  process.stderr.write("gateway: dist/ is missing; run `npm run build` first\n");
  process.exit(1);
}
await import(main.href);
