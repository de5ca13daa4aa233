// The translation unit that builds the precompiled header (pch.h); it has no code of its own.
