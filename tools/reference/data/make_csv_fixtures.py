"""CSV and TSV files and the rows Hugging Face `datasets` reads from them (a Python with
`datasets`, `pandas` and `pyarrow`; run with datasets 5.2.0, pandas 3.1.1, pyarrow 26.0.1):

    python tools/reference/data/make_csv_fixtures.py

Writes each file below into csv/ next to this script, loads it as `load_dataset(folder)` loads a
folder holding only that file (so `.tsv` gets its tab separator from the extension, as it does
for a folder or a Hub dataset; `load_dataset("csv", data_files=...)` reads every file with `,`
unless given `sep`), and records in csv_fixtures.json per file: the columns and their types, the
rows (run-length encoded: `[count, row]`; null for a missing value, "inf" / "-inf" for infinite
floats), or the error `datasets` raised. `crates/data/tests/csv.rs` reads every file through
g4ft-data and must give the same rows, or refuse the file.

The files cover: type inference per column (integers, floats, booleans in any case, mixed
columns as text), empty cells and pandas' default missing-value strings, quoting (embedded
newlines, quotes and separators, text after a closing quote, a quote inside a field), a UTF-8
byte order mark, CRLF and CR line ends, blank and whitespace-only lines, short rows (padded)
and long rows (an error, or the row index pandas infers from a first row one field longer than
the header), duplicate and empty header names, whitespace around values, integers past 64 bits,
gzip and zstd compression, and the chunks `datasets` reads (10,000 rows): the first chunk's
types hold for the file, later chunks are cast to them (those files are gzip-compressed).
"""

import gzip
import json
import math
import os
import shutil
import tempfile

import datasets
import pandas
import pyarrow
import zstandard

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "csv")
N = 10_000  # the csv builder's chunk size (rows)

NA_TOKENS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
             "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
NOT_NA = ["NAN", "+nan", "none", "Null", "na", " NA", "NaN ", "nil"]


def q(s):
    return '"' + s.replace('"', '""') + '"'


CASES = {
    # type inference
    "types.csv": "int,float,bool,text,mixed\n1,2.5,True,x,1\n-2,3,false,y,x\n007,1e5,TRUE,z,2.5\n",
    "numbers.csv": "a,b,c,d,e,f,g,h,i\n+1,.5,1.,-.5,inf,-Infinity,1e400,1e-400,0.1e1\n"
                   "-0,1E-5,+3,1.5e3,INF,+inf,-1e400,2.2250738585072014e-308,1.7976931348623157e308\n",
    "not_numbers.csv": "a,b,c,d,e,f,g,h\n1_000,0x10,1e,e5,.,\"1,5\",1.5.5,+-1\n1,2,3,4,5,6,7,8\n",
    "int_and_float.csv": "a,b\n1,1\n1.0,2\n",
    "negative_zero.csv": "a,b,c,d\n-0,-0,-0,1.5\nNA,1e3,-0.0,-0\n-0,NA,NA,NA\n",
    "inf_with_spaces.csv": "a,b,c,d\n1.5, -inf,inf ,-Infinity\n2,inf,\"+Infinity\" ,2\n",
    "int_limits.csv": "a,b\n9223372036854775807,18446744073709551615\n-9223372036854775808,1\n",
    "bools.csv": "a,b,c\nTrue,tRuE,true\nFALSE,false,fAlSe\n",
    "bool_and_int.csv": "a,b\nTrue,1\n1,2\n",
    "bool_with_missing.csv": "a,b\nTrue,1\n,2\nFalse,3\n",
    # missing values
    "empty_cells.csv": "a,b,c\n,x,\n1,,\n",
    "na_strings.csv": "a,b\n" + "".join(f"{q(t)},{i}\n" for i, t in enumerate(NA_TOKENS + NOT_NA)),
    "na_in_ints.csv": "a,b\n1,NA\n2,3\nnull,4\n",
    "all_missing.csv": "a,b\n,x\nNA,y\n",
    "missing_row.csv": "a,b\n1,x\n,\n2,y\n",
    "quoted_numbers.csv": 'a,b\n"1","2.5"\n"3",""\n',
    "na_header.csv": "NA,null,x\n1,2,3\n",
    # quoting
    "quoting.csv": 'a,b,c\n"he said ""hi""","line1\nline2","x,y"\n"ab"c,x"y,"q" \n""z,"",  "w"\n'
                   '"a\r\nb","\n\n",end\n',
    "unterminated_quote.csv": 'a,b\n1,x\n"abc,1\n',
    # encodings and line ends
    "bom.csv": "\ufeffa,b\n1,x\n",
    "bom_quoted_header.csv": '\ufeff"a",b\n1,2\n',
    "crlf.csv": "a,b\r\n1,x\r\n2,y\r\n",
    "cr.csv": "a,b\r1,x\r2,y\r",
    "cr_in_field.csv": 'a,b\n"x\ry",1\nx\ry,2\n',
    "no_final_newline.csv": "a,b\n1,x",
    "nul.csv": "a,b\nx\x00y,1\n",
    "invalid_utf8.csv": b"a,b\n1,x\n\xff,y\n",
    "latin1.csv": "a,b\ncaf\xe9,1\n".encode("latin-1"),
    # blank lines
    "blank_lines.csv": "\n\na,b\n\n1,x\n   \n\t\n2,y\n\n",
    "whitespace_then_field.csv": "a,b\n1,x\n   ,\n2,y\n",
    "header_only.csv": "a,b\n\n",
    "empty.csv": "",
    # field counts
    "short_rows.csv": "a,b,c\n1,2\n4,5,6\n7\n",
    "long_row_later.csv": "a,b\n1,2\n4,5,6\n",
    "index_range.csv": "a,b\n1,2,\n3,4,\n5,6,\n",
    "index_column.csv": "a,b\nx,1,2\ny,3\nz,5,6\n",
    "index_one_row.csv": "a,b\n7,1,2\n",
    "index_int_not_range.csv": "a,b\n1,2,3\n2,5,6\n4,7,8\n",
    "index_with_missing.csv": "a,b\n1,2,3\n,5,6\n3,7,8\n",
    "index_long_row.csv": "a,b\n1,2,3\n4,5,6,7\n",
    "two_index_columns.csv": "a,b\n1,2,3,4\n5,6\n",
    "two_index_columns_zeros.csv": "a\n-0,0.5,x\n1.5,0,y\n0,-0,z\n",
    "index_name_taken.csv": "a,__index_level_0__\nx,1,2\ny,5,4\n",
    "index_names_taken.csv": "a,__index_level_1__\nx,y,1,2\ny,z,5,4\n",
    # header names
    "duplicate_names.csv": "a,a,a.1,a,b,b\n1,2,3,4,5,6\n",
    "duplicate_names_2.csv": "b,a,a,a.1,a.1\n1,2,3,4,5\n",
    "empty_names.csv": "a,,c,\n1,2,3,4\n",
    "unnamed_collision.csv": ",Unnamed: 0,\n1,2,3\n",
    "header_whitespace.csv": ' a ,"b,c"\n1,2\n',
    # whitespace
    "whitespace.csv": "a,b,c,d,e,f\n x , 1 ,\t2\t, True, NA ,\"\n3\r\n\"\n  y,1 , 2 ,False,x,\x0b4\x0c\n",
    # separators
    "tabs.tsv": 'a\tb\tc\n1\t"x\ty"\tp,q\n2\t"line\nbreak"\t"r"\n',
    "tab_lines.tsv": "a\tb\n1\tx\n\t\n  \n \t \n2\ty\n",
    "cr_blank_then_separator.csv": "a,b\r\r,x\r \r,y\r1,2\r\r\n,z\r\n\r,\r3,4\r",
    "semicolons.csv": "a;b\n1;2\n",
    # integers past 64 bits (see the test for what g4ft-data does with each)
    "int_past_u64.csv": "a\n99999999999999999999\n1\n",
    "int_below_i64.csv": "a\n-9223372036854775809\n1\n",
    "u64_and_negative.csv": "a\n9223372036854775808\n-1\n",
    "u64_and_negative_zero.csv": "a\n-0\n9223372036854775808\n1\n",
    "u64_text_and_missing.csv": "a,b\nx,1\n9223372036854775808,2\n,3\n",
    "u64_and_float.csv": "a\n18446744073709551615\n1.5\n",
    "u64_and_missing.csv": "a,b\n18446744073709551615,1\n,2\n",
    "big_int_and_text.csv": "a\n99999999999999999999\nx\n",
    # prompt/completion rows as a spreadsheet exports them
    "prompt_completion.csv": 'prompt,completion\n"What is 2+2?","4"\n"Say ""hi"", twice","hi, hi"\n'
                             '"Two\nlines?","Yes:\r\none, two"\n',
}

# Files of more than one chunk (gzip-compressed).
CHUNKED = {
    # each column text in the first chunk; in the second, integers (b), floats (c), booleans (d)
    "chunk_text_then_numbers.csv.gz": "a,b,c,d\n" + "0,x,x,x\n" * N + "1,0042,1.50,True\n2,7,1e20,false\n"
    "3,-3,1e16,TRUE\n4,+5,123456789.125,\n5,,2e-7,\n6,1,-0.0,\n7,1,1e-5,\n8,1,12345678901.0,\n9,1,1e15,\n"
    "10,1,0.000001,\n11,1,1e-7,\n12,1,1234567890,\n13,1,-inf,\n14,1,2.2250738585072014e-308,\n",
    "chunk_text_then_bool.csv.gz": "a\n" + "x\n" * N + "True\nfalse\n",
    "chunk_int_then_text.csv.gz": "a\n" + "1\n" * N + "x\n",
    "chunk_int_then_integral_float.csv.gz": "a\n" + "1\n" * N + "2.0\n-0.0\n",
    "chunk_int_then_fraction.csv.gz": "a\n" + "1\n" * N + "2.5\n",
    "chunk_int_then_missing.csv.gz": "a\n" + "1\n" * N + "NA\n",
    "chunk_float_then_int.csv.gz": "a\n" + "1.5\n" * N + "2\n",
    "chunk_text_then_float_tie.csv.gz": "a\n" + "x\n" * N + "214366600533157.12\n0.3\n",
    "chunk_missing_then_text.csv.gz": "a,b\n" + ",1\n" * N + "x,2\n",
    "chunk_missing_then_int.csv.gz": "a,b\n" + ",1\n" * N + "3,2\n",
    "chunk_bool_then_int.csv.gz": "a\n" + "True\n" * N + "5\n0\n",
    "chunk_int_then_bool.csv.gz": "a\n" + "1\n" * N + "True\nFalse\n",
    "chunk_int_then_u64.csv.gz": "a\n" + "1\n" * N + "18446744073709551615\n",
    "chunk_blank_lines_not_counted.csv.gz": "a\n" + "1\n" * (N - 1) + "\n\n" + "x\n",
    "chunk_quoted_newlines.csv.gz": "a,b\n" + '"p\nq",1\n' * (N - 1) + "z,2\n3,3\n",
    "chunk_index_range_then_not.csv.gz": "a\n" + "".join(f"{i},x\n" for i in range(N)) + "5,y\n7,z\n3,w\n",
    "chunk_index_not_range_then_range.csv.gz": "a\n" + "0,x\n" * N + "5,y\n6,z\n",
    "chunk_bool_then_text_bool.csv.gz": "a\n" + "True\n" * N + "True\n1\n",
}

COMPRESSED = {
    "zstd.csv.zst": ("zstd", "a,b\n1,x\n2,y\n"),
    "gzip.tsv.gz": ("gzip", "a\tb\n1\tx,y\n2\t\n"),
}


def encode(text):
    return text if isinstance(text, bytes) else text.encode()


def json_value(v):
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def run_length(rows):
    out = []
    for row in rows:
        row = {k: json_value(v) for k, v in row.items()}
        if out and out[-1][1] == row:
            out[-1][0] += 1
        else:
            out.append([1, row])
    return out


def read(name, data):
    """What `load_dataset(folder)` gives for a folder holding only `name`."""
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        try:
            dd = datasets.load_dataset(root, cache_dir=os.path.join(root, ".cache"))
        except Exception as e:  # datasets refuses the file: g4ft-data must refuse it too
            cause = e.__cause__ or e
            message = str(cause).replace(root, "FOLDER").strip()[:300]
            return {"error": f"{type(cause).__name__}: {message}"}
        (ds,) = dd.values()
        features = {k: str(v.dtype) for k, v in ds.features.items()}
        return {"features": features, "rows": run_length(ds.to_list())}


def main():
    print(f"datasets {datasets.__version__}, pandas {pandas.__version__}, pyarrow {pyarrow.__version__}")
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    files = {name: encode(text) for name, text in CASES.items()}
    for name, text in CHUNKED.items():
        files[name] = gzip.compress(text.encode(), mtime=0)
    for name, (codec, text) in COMPRESSED.items():
        files[name] = gzip.compress(text.encode(), mtime=0) if codec == "gzip" else \
            zstandard.ZstdCompressor(level=3).compress(text.encode())
    cases = []
    for name, data in files.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        got = read(name, data)
        cases.append({"file": name, **got})
        summary = got.get("error") or f"{sum(n for n, _ in got['rows'])} rows, {got['features']}"
        print(f"{name}: {summary[:150]}")
    path = os.path.join(HERE, "csv_fixtures.json")
    with open(path, "w") as f:
        versions = {"datasets": datasets.__version__, "pandas": pandas.__version__,
                    "pyarrow": pyarrow.__version__}
        json.dump({**versions, "chunk_rows": N, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
