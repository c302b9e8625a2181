module krypton.local/testpod

go 1.24
