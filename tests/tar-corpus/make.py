#!/usr/bin/env python3
"""Writes the tar regression corpus (python3 tests/tar-corpus/make.py tests/tar-corpus).

Each archive is one way tar readers read the same bytes differently, or a case that found a
bug; tests/tar-corpus/expect.txt says what the operator's canonicaliser must answer and what
busybox tar and GNU tar did with the raw archive when it was written (checked by
src/snapshot/archive/differential.rs). The archives are committed; this script is their
provenance.
"""
import os, sys
def octal(v, width):
    return (b"%0*o" % (width-1, v)) + b"\0"
def header(name, flag=b"0", size=0, link=b"", magic="posix", prefix=b"", mode=0o644, raw_size=None, raw_mode=None, signed=False):
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = raw_mode if raw_mode is not None else octal(mode, 8)
    h[108:116] = octal(0, 8); h[116:124] = octal(0, 8)
    h[124:136] = raw_size if raw_size is not None else octal(size, 12)
    h[136:148] = octal(1700000000, 12)
    h[156:157] = flag
    h[157:157+len(link)] = link
    if magic == "posix": h[257:265] = b"ustar\x0000"
    elif magic == "gnu": h[257:265] = b"ustar  \x00"
    h[345:345+len(prefix)] = prefix
    h[148:156] = b" " * 8
    if signed:
        s = sum((b if b < 128 else b - 256) for b in h)
    else:
        s = sum(h)
    h[148:156] = b"%06o\0 " % (s & 0o777777 if s >= 0 else (s + (1 << 18)))
    return bytes(h)
def pad(b): return b + b"\0" * ((-len(b)) % 512)
def member(name, data=b"", **kw):
    return header(name, size=len(data), **kw) + pad(data)
def rec(k, v):
    body = len(k) + len(v) + 3
    n = body + 1
    while n != body + len(str(n)): n = body + len(str(n))
    return b"%d %s=%s\n" % (n, k, v)
def ext(flag, data, magic="posix"):
    return header(b"././@LongLink" if flag in b"LK" else b"PaxHeader", flag=flag, size=len(data), magic=magic) + pad(data)
END = b"\0" * 1024
cases = {}
cases["link-name-on-file"] = member(b"f0", b"x") + member(b"f1", b"own content", link=b"f0") + END
cases["size-on-dir"] = header(b"d/", flag=b"5", size=512) + header(b"hidden") + member(b"visible", b"v") + END
cases["pax-size-mismatch"] = ext(b"x", rec(b"size", b"0")) + header(b"f", size=512) + header(b"hidden", size=0) + member(b"visible", b"v") + END
cases["lone-zero-block"] = member(b"a", b"a") + b"\0" * 512 + member(b"after-zero", b"b") + END
cases["prefix-in-old-gnu"] = member(b"f", b"x", magic="gnu", prefix=b"pfx") + END
cases["prefix-in-v7"] = member(b"f", b"x", magic="v7", prefix=b"pfx") + END
cases["pax-global-path"] = ext(b"g", rec(b"path", b"renamed")) + member(b"a", b"a") + END
cases["gnu-long-name-and-pax-path"] = ext(b"L", b"from-L\0") + ext(b"x", rec(b"path", b"from-pax")) + member(b"h", b"x") + END
cases["pax-path-then-gnu-long-name"] = ext(b"x", rec(b"path", b"from-pax")) + ext(b"L", b"from-L\0") + member(b"h", b"x") + END
cases["two-gnu-long-names"] = ext(b"L", b"first\0") + ext(b"L", b"second\0") + member(b"h", b"x") + END
cases["signed-checksum"] = member(b"\xe2\x82\xac-euro", b"x", signed=True) + END
cases["empty-name-after-gnu-long-name"] = ext(b"L", b"named\0") + member(b"", b"x") + member(b"visible", b"v") + END
cases["file-named-like-a-dir"] = member(b"d/", b"") + END
cases["negative-mode"] = member(b"f", b"x", raw_mode=b"-000644\0") + END
cases["bytes-after-numeric-terminator"] = member(b"f", b"x", raw_mode=b"644\0\x31\x32\x33\0") + END
cases["pax-linkpath"] = ext(b"x", rec(b"linkpath", b"good")) + header(b"l", flag=b"2", link=b"bad") + END
cases["long-name-bytes-after-nul"] = ext(b"L", b"short\0hidden-tail") + member(b"h", b"x") + END
b256 = bytes([0x80] + [0]*8 + [0, 0, 3])
cases["base-256-size"] = header(b"f", raw_size=b256) + pad(b"abc") + END
cases["pax-duplicate-key"] = ext(b"x", rec(b"path", b"one") + rec(b"path", b"two")) + member(b"h", b"x") + END
cases["gnu-long-link-and-pax-linkpath"] = ext(b"K", b"from-K\0") + ext(b"x", rec(b"linkpath", b"from-pax")) + header(b"l", flag=b"2", link=b"x") + END
cases["extension-without-member"] = member(b"a", b"a") + ext(b"L", b"dangling\0") + END
cases["size-on-symlink"] = header(b"l", flag=b"2", link=b"a", size=512) + header(b"hidden") + member(b"visible", b"v") + END
cases["mode-bits-setuid"] = member(b"suid", b"x", mode=0o4755) + END
out = sys.argv[1]
for name, data in cases.items():
    open(os.path.join(out, name + ".tar"), "wb").write(data)
