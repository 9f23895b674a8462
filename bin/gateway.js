#!/usr/bin/env node
// Runs the TypeScript CLI through tsx's loader, in this process (no npx process chain).
import { register } from "tsx/esm/api";

register();
await import("../src/cli/main.ts");
