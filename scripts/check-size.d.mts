// Types of scripts/check-size.mjs for the tests that import it.
export interface Measured {
  files: { file: string; lines: number }[];
  functions: { file: string; name: string; lines: number }[];
}
export const maxFileLines: number;
export const maxFunctionLines: number;
export const maxExceptions: number;
export function measure(dir?: string): Measured;
export function exceptions(): string[];
export function violations(measured: Measured, allowed?: string[]): string[];
