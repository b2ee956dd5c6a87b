"""A CPU-bound program without GPU or steps: sum() takes nearly all of its time."""


def main():
    total = 0
    for _ in range(30):
        total += sum(range(200_000))  # sum line
    print("total", total)


main()
